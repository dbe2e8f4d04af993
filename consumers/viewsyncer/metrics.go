package viewsyncer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	connections prometheus.Gauge
	pokes       prometheus.Counter
	advances    prometheus.Counter
	closedSlow  prometheus.Counter
	hydrations  prometheus.Counter
	fallbacks   prometheus.Counter
	rowsRead    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "connections",
			Help: "Open sync websockets.",
		}),
		pokes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "pokes_total",
			Help: "Pokes sent to clients.",
		}),
		advances: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "advances_total",
			Help: "Replica advances processed.",
		}),
		closedSlow: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "slow_clients_closed_total",
			Help: "Connections closed because their send queue overflowed.",
		}),
		hydrations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "query_hydrations_total",
			Help: "Full query hydrations: new queries, and re-runs after a reset or a rules or schema change.",
		}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "query_update_fallbacks_total",
			Help: "Incremental query updates that re-ran the whole query instead.",
		}),
		rowsRead: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "replica_rows_read_total",
			Help: "Replica rows read to hydrate and update queries.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.connections, m.pokes, m.advances, m.closedSlow, m.hydrations, m.fallbacks, m.rowsRead} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return m, nil
}
