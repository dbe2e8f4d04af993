package restore

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	runs, attempts *prometheus.CounterVec
	downloaded     prometheus.Counter
	dbBytes, eta   prometheus.Gauge
	snapshotRows   prometheus.Gauge
	rows           prometheus.Gauge
	catchUpLeft    prometheus.Gauge
	catchUpETA     prometheus.Gauge
	duration       prometheus.Histogram
	validation     prometheus.Histogram
	reservation    prometheus.Histogram
}

// newMetrics makes the restore metrics, named after zero-cache's
// zero.replica.litestream.restore.*, and registers them with reg if set.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	buckets := prometheus.ExponentialBuckets(0.01, 2, 18)
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zero_replica_restore_runs", Help: "Restores, by result.",
		}, []string{"result"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zero_replica_restore_attempts", Help: "Restore attempts, by result.",
		}, []string{"result"}),
		downloaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_restore_downloaded_bytes", Help: "Snapshot bytes downloaded.",
		}),
		dbBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "zero_replica_restore_db_bytes", Help: "Size of the last restored replica.",
		}),
		eta: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_restore_eta_seconds", Help: "Estimated time left in the download in progress.",
		}),
		snapshotRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_restore_snapshot_rows", Help: "Rows in the snapshot being restored, as recorded when it was taken.",
		}),
		rows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_restore_rows", Help: "Rows of the snapshot downloaded so far (estimated from its bytes).",
		}),
		catchUpLeft: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_restore_catchup_remaining_messages", Help: "Change stream messages left to apply before a restored replica has caught up.",
		}),
		catchUpETA: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_restore_catchup_eta_seconds", Help: "Estimated time left in the catch-up after a restore.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "zero_replica_restore_duration_seconds", Help: "Time from reservation to a replica in place.", Buckets: buckets,
		}),
		validation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "zero_replica_restore_validation_duration_seconds", Help: "Time to validate a downloaded snapshot.", Buckets: buckets,
		}),
		reservation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jetsync_restore_reservation_seconds", Help: "How long reservations were held until caught up.", Buckets: buckets,
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	for _, v := range []**prometheus.CounterVec{&m.runs, &m.attempts} {
		if *v, err = register(reg, *v); err != nil {
			return nil, err
		}
	}
	if m.downloaded, err = register(reg, m.downloaded); err != nil {
		return nil, err
	}
	for _, g := range []*prometheus.Gauge{&m.dbBytes, &m.eta, &m.snapshotRows, &m.rows, &m.catchUpLeft, &m.catchUpETA} {
		if *g, err = register(reg, *g); err != nil {
			return nil, err
		}
	}
	for _, h := range []*prometheus.Histogram{&m.duration, &m.validation, &m.reservation} {
		if *h, err = register(reg, *h); err != nil {
			return nil, err
		}
	}
	return m, nil
}

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
