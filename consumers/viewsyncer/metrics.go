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
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.connections, m.pokes, m.advances, m.closedSlow} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return m, nil
}
