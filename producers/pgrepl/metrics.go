package pgrepl

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	transactions prometheus.Counter
	changes      prometheus.Counter
	lastSeq      prometheus.Gauge
	confirmed    prometheus.Gauge
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		transactions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "zero_replication_transactions",
			Help: "Upstream transactions published to the change stream.",
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "zero_replication_changes",
			Help: "Row changes published to the change stream.",
		}),
		lastSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_stream_last_seq",
			Help: "Sequence of the last change message acked by JetStream.",
		}),
		confirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_producer_confirmed_lsn",
			Help: "LSN confirmed to the upstream replication slot.",
		}),
	}
	if r != nil {
		for _, c := range []prometheus.Collector{m.transactions, m.changes, m.lastSeq, m.confirmed} {
			if err := r.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
