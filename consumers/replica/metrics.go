package replica

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

type metrics struct {
	txns, changes prometheus.Counter
	lsn, seq      prometheus.Gauge
}

// newMetrics makes the consumer's metrics, named as zero-cache's where it
// has them, and registers them with reg if it is not nil.
func newMetrics(reg prometheus.Registerer, name string) (*metrics, error) {
	labels := prometheus.Labels{"consumer": name}
	m := &metrics{
		txns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "zero_replication_transactions", Help: "Upstream transactions applied to the replica.", ConstLabels: labels,
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "zero_replication_changes", Help: "Changes (rows and schema changes) applied to the replica.", ConstLabels: labels,
		}),
		lsn: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_replica_watermark_lsn", Help: "The replica's watermark, as an LSN.", ConstLabels: labels,
		}),
		seq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_replica_stream_seq", Help: "The change stream sequence the replica has applied.", ConstLabels: labels,
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.txns, err = register(reg, m.txns); err != nil {
		return nil, err
	}
	if m.changes, err = register(reg, m.changes); err != nil {
		return nil, err
	}
	if m.lsn, err = register(reg, m.lsn); err != nil {
		return nil, err
	}
	if m.seq, err = register(reg, m.seq); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the identical collector registered
// before (a consumer restarted in the same process).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if old, ok := are.ExistingCollector.(C); ok {
			return old, nil
		}
	}
	return c, err
}

func (m *metrics) observe(st replica.State) {
	lsn, _ := streams.ParseLexi(st.Watermark)
	m.lsn.Set(float64(lsn))
	m.seq.Set(float64(st.StreamSeq))
}
