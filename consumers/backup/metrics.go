package backup

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/promreg"
)

type metrics struct {
	purgeBlocked   *prometheus.CounterVec
	backupLag      prometheus.Gauge
	snapshots      *prometheus.CounterVec
	snapshotBytes  prometheus.Gauge
	snapshotTime   prometheus.Histogram
	purgedMsgs     prometheus.Counter
	purgeSeq       prometheus.Gauge
	cleanupDelay   prometheus.Gauge
	verifiedSeq    prometheus.Gauge
	checks         prometheus.Counter
	reservationDur *prometheus.HistogramVec
}

// newMetrics makes the producer's metrics, named as zero-cache's where it
// has them (zero.replica.purge_blocked, zero.replica.backup_lag), and
// registers them with reg if it is not nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	m := &metrics{
		purgeBlocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zero_replica_purge_blocked_total", Help: "Change stream purges blocked, by reason.",
		}, []string{"reason"}),
		backupLag: gauge("zero_replica_backup_lag_seconds", "The backup replica's write time minus the newest claimed snapshot's (zero.replica.backup_lag)."),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetsync_backup_snapshots_total", Help: "Snapshots taken, by result.",
		}, []string{"result"}),
		snapshotBytes: gauge("jetsync_backup_snapshot_bytes", "Size of the newest snapshot uploaded."),
		snapshotTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jetsync_backup_snapshot_duration_seconds", Help: "Time to take and upload a snapshot.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}),
		purgedMsgs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_backup_purged_messages_total", Help: "Change stream messages purged by the backup monitor.",
		}),
		purgeSeq:     gauge("jetsync_backup_purge_seq", "The change stream sequence the last purge kept from."),
		cleanupDelay: gauge("jetsync_backup_cleanup_delay_seconds", "How old a verified snapshot must be before history below it is purged."),
		verifiedSeq:  gauge("jetsync_backup_verified_stream_seq", "Stream sequence of the newest verified snapshot."),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_backup_monitor_checks_total", Help: "Backup monitor checks run.",
		}),
		reservationDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "zero_replica_snapshot_reservation_duration_seconds", Help: "How long restore reservations were held, by result.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 16),
		}, []string{"result"}),
	}
	if err := promreg.Register(reg, &m.purgeBlocked, &m.snapshots); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.reservationDur); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.backupLag, &m.snapshotBytes, &m.purgeSeq, &m.cleanupDelay, &m.verifiedSeq); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.snapshotTime); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.purgedMsgs, &m.checks); err != nil {
		return nil, err
	}
	return m, nil
}
