package backup

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
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
	m := &metrics{
		purgeBlocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "zero_replica_purge_blocked", Help: "Change stream purges blocked, by reason.",
		}, []string{"reason"}),
		backupLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "zero_replica_backup_lag", Help: "The backup replica's write time minus the newest claimed snapshot's, in ms.",
		}),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetsync_backup_snapshots", Help: "Snapshots taken, by result.",
		}, []string{"result"}),
		snapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_backup_snapshot_bytes", Help: "Size of the newest snapshot uploaded.",
		}),
		snapshotTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "jetsync_backup_snapshot_duration_seconds", Help: "Time to take and upload a snapshot.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}),
		purgedMsgs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_backup_purged_messages", Help: "Change stream messages purged by the backup monitor.",
		}),
		purgeSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_backup_purge_seq", Help: "The change stream sequence the last purge kept from.",
		}),
		cleanupDelay: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_backup_cleanup_delay_seconds", Help: "How old a verified snapshot must be before history below it is purged.",
		}),
		verifiedSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_backup_verified_stream_seq", Help: "Stream sequence of the newest verified snapshot.",
		}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_backup_monitor_checks", Help: "Backup monitor checks run.",
		}),
		reservationDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "zero_replica_snapshot_reservation_duration_seconds", Help: "How long restore reservations were held, by result.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 16),
		}, []string{"result"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.purgeBlocked, err = register(reg, m.purgeBlocked); err != nil {
		return nil, err
	}
	if m.snapshots, err = register(reg, m.snapshots); err != nil {
		return nil, err
	}
	if m.reservationDur, err = register(reg, m.reservationDur); err != nil {
		return nil, err
	}
	for _, g := range []*prometheus.Gauge{&m.backupLag, &m.snapshotBytes, &m.purgeSeq, &m.cleanupDelay, &m.verifiedSeq} {
		if *g, err = register(reg, *g); err != nil {
			return nil, err
		}
	}
	if m.snapshotTime, err = register(reg, m.snapshotTime); err != nil {
		return nil, err
	}
	if m.purgedMsgs, err = register(reg, m.purgedMsgs); err != nil {
		return nil, err
	}
	if m.checks, err = register(reg, m.checks); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the identical collector registered
// before (a producer restarted in the same process).
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
