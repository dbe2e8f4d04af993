package restore

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/promreg"
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
	histogram := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: prometheus.ExponentialBuckets(0.01, 2, 18)})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zero_replica_restore_runs_total", Help: "Restores, by result.",
		}, []string{"result"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zero_replica_restore_attempts_total", Help: "Restore attempts, by result.",
		}, []string{"result"}),
		downloaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_restore_downloaded_bytes_total", Help: "Snapshot bytes downloaded.",
		}),
		dbBytes:      gauge("zero_replica_restore_db_bytes", "Size of the last restored replica."),
		eta:          gauge("jetsync_restore_eta_seconds", "Estimated time left in the download in progress."),
		snapshotRows: gauge("jetsync_restore_snapshot_rows", "Rows in the snapshot being restored, as recorded when it was taken."),
		rows:         gauge("jetsync_restore_rows", "Rows of the snapshot downloaded so far (estimated from its bytes)."),
		catchUpLeft:  gauge("jetsync_restore_catchup_remaining_messages", "Change stream messages left to apply before a restored replica has caught up."),
		catchUpETA:   gauge("jetsync_restore_catchup_eta_seconds", "Estimated time left in the catch-up after a restore."),
		duration:     histogram("zero_replica_restore_duration_seconds", "Time from reservation to a replica in place."),
		validation:   histogram("zero_replica_restore_validation_duration_seconds", "Time to validate a downloaded snapshot."),
		reservation:  histogram("jetsync_restore_reservation_seconds", "How long reservations were held until caught up."),
	}
	if err := promreg.Register(reg, &m.runs, &m.attempts); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.downloaded); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.dbBytes, &m.eta, &m.snapshotRows, &m.rows, &m.catchUpLeft, &m.catchUpETA); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.duration, &m.validation, &m.reservation); err != nil {
		return nil, err
	}
	return m, nil
}
