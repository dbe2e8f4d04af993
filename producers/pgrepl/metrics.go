package pgrepl

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/progress"
)

type metrics struct {
	transactions prometheus.Counter
	changes      prometheus.Counter
	lastSeq      prometheus.Gauge
	confirmed    prometheus.Gauge
	slotWAL      prometheus.Gauge
	// streamedCommits and streamedAborts count the transactions Postgres
	// streamed before their end.
	streamedCommits, streamedAborts prometheus.Counter
	// initialSync and backfill are the copies' progress.
	initialSync, backfill *progress.Metrics
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		transactions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "zero_replication_transactions_total",
			Help: "Upstream transactions published to the change stream (zero.replication.transactions).",
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "zero_replication_changes_total",
			Help: "Row changes published to the change stream (zero.replication.changes).",
		}),
		lastSeq: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_stream_last_seq",
			Help: "Sequence of the last change message acked by JetStream.",
		}),
		slotWAL: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "zero_replication_slot_retained_wal_bytes",
			Help: "WAL the replication slot holds back upstream: the current WAL position minus the slot's restart_lsn (zero.replication.slot_retained_wal_bytes).",
		}),
		confirmed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetsync_producer_confirmed_lsn",
			Help: "LSN confirmed to the upstream replication slot.",
		}),
		streamedCommits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_producer_streamed_commits_total",
			Help: "Upstream transactions streamed before their commit, then committed.",
		}),
		streamedAborts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetsync_producer_streamed_aborts_total",
			Help: "Upstream transactions streamed before their end, then rolled back.",
		}),
	}
	var err error
	if m.initialSync, err = progress.NewMetrics(r, "jetsync_initial_sync", "the initial sync"); err != nil {
		return nil, err
	}
	if m.backfill, err = progress.NewMetrics(r, "jetsync_backfill", "the copy of a table after a schema change"); err != nil {
		return nil, err
	}
	if r != nil {
		for _, c := range []prometheus.Collector{m.transactions, m.changes, m.lastSeq, m.confirmed, m.slotWAL, m.streamedCommits, m.streamedAborts} {
			if err := r.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
