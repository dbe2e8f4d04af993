package replicator

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/promreg"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

type metrics struct {
	txns, changes prometheus.Counter
	lsn, seq      prometheus.Gauge
	// pending is the consumer's lag: messages the stream holds past it.
	pending prometheus.Gauge
	lag     prometheus.Histogram
	// diskFull is 1 while writes to the replica fail for want of space.
	diskFull        prometheus.Gauge
	diskFullRetries prometheus.Counter
}

// newMetrics makes the consumer's metrics and registers them with reg if it is not nil.
func newMetrics(reg prometheus.Registerer, name string) (*metrics, error) {
	labels := prometheus.Labels{"consumer": name}
	m := &metrics{
		txns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_replica_transactions_total", Help: "Upstream transactions applied to the replica.", ConstLabels: labels,
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_replica_changes_total", Help: "Changes (rows and schema changes) applied to the replica.", ConstLabels: labels,
		}),
		lsn: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_replica_watermark_lsn", Help: "The replica's watermark, as an LSN.", ConstLabels: labels,
		}),
		seq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_replica_stream_seq", Help: "The change stream sequence the replica has applied.", ConstLabels: labels,
		}),
		// zero-cache has no metric for this; the name follows Prometheus's
		// conventions.
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_replica_pending_messages", Help: "Change stream messages past the last one this consumer received (its lag behind the stream).", ConstLabels: labels,
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jetsync_replication_lag_seconds", Help: "Upstream commit to replica commit, per transaction.", ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms to 16 s
		}),
		diskFull: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_replica_disk_full", Help: "1 while writes to the replica fail because its disk is full; they are retried with backoff.", ConstLabels: labels,
		}),
		diskFullRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_replica_disk_full_retries_total", Help: "Writes to the replica that failed because its disk was full, each retried after a backoff.", ConstLabels: labels,
		}),
	}
	if err := promreg.Register(reg, &m.txns, &m.changes, &m.diskFullRetries); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.lsn, &m.seq, &m.diskFull, &m.pending); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.lag); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) observe(st replica.State) {
	lsn, _ := streams.ParseLexi(st.Watermark)
	m.lsn.Set(float64(lsn))
	m.seq.Set(float64(st.StreamSeq))
}

// observeLag records commit-to-applied lag for transactions that committed
// upstream at commitTimes (ms since the epoch) and are applied as of now.
func (m *metrics) observeLag(now time.Time, commitTimes []float64) {
	nowMs := float64(now.UnixMicro()) / 1000
	for _, t := range commitTimes {
		m.lag.Observe(max(0, nowMs-t) / 1000)
	}
}
