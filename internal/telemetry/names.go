package telemetry

import (
	"context"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// ZeroName ties a Prometheus metric of jetsync's to the zero-cache 1.9.0
// instrument that measures the same thing: over OTLP the figure carries
// zero-cache's name and unit, so that dashboards built on zero-cache's
// export read jetsync's; /metrics keeps the Prometheus name.
type ZeroName struct {
	Prom, Zero, Unit string
}

// ZeroNames is every such pair. The README's metric table lists them
// (TestREADMEMetricNames).
var ZeroNames = []ZeroName{
	{"zero_replication_transactions_total", "zero.replication.transactions", ""},
	{"zero_replication_changes_total", "zero.replication.changes", ""},
	{"zero_replication_slot_retained_wal_bytes", "zero.replication.slot_retained_wal_bytes", "By"},
	{"zero_replica_purge_blocked_total", "zero.replica.purge_blocked", ""},
	{"zero_replica_backup_lag_seconds", "zero.replica.backup_lag", "s"},
	{"zero_replica_restore_runs_total", "zero.replica.litestream.restore.runs", ""},
	{"zero_replica_restore_attempts_total", "zero.replica.litestream.restore.attempts", ""},
	{"zero_replica_restore_db_bytes", "zero.replica.litestream.restore.db_bytes", "By"},
	{"zero_replica_restore_duration_seconds", "zero.replica.litestream.restore.duration", "s"},
	{"zero_replica_restore_validation_duration_seconds", "zero.replica.litestream.restore.validation_duration", "s"},
	{"zero_replica_snapshot_reservation_duration_seconds", "zero.replica.litestream.snapshot.reservation_duration", "s"},
	{"zero_sync_active_clients", "zero.sync.active-clients", ""},
	{"zero_sync_active_client_groups", "zero.sync.active-client-groups", ""},
	{"zero_sync_hydration_total", "zero.sync.hydration", ""},
	{"zero_sync_hydration_time_seconds", "zero.sync.hydration-time", "s"},
	{"zero_sync_advance_time_seconds", "zero.sync.advance-time", "s"},
	{"zero_sync_poke_time_seconds", "zero.sync.poke.time", "s"},
	{"zero_sync_poke_transactions_total", "zero.sync.poke.transactions", ""},
	{"zero_sync_lock_wait_time_seconds", "zero.sync.lock-wait-time", "s"},
	{"zero_sync_pipeline_resets_total", "zero.sync.pipeline-resets", ""},
	{"zero_sync_query_transformations_total", "zero.sync.query.transformations", ""},
	{"zero_sync_query_transformation_time_seconds", "zero.sync.query.transformation-time", "s"},
	{"zero_sync_query_transformation_hash_changes_total", "zero.sync.query.transformation-hash-changes", ""},
	{"zero_sync_query_transformation_no_ops_total", "zero.sync.query.transformation-no-ops", ""},
	{"zero_sync_queries", "zero.sync.queries", ""},
	{"zero_sync_rows", "zero.sync.rows", ""},
	{"zero_mutation_pushes_total", "zero.mutation.pushes", ""},
	{"zero_mutation_custom_total", "zero.mutation.custom", ""},
	{"zero_mutation_crud_total", "zero.mutation.crud", ""},
}

var zeroByProm = func() map[string]ZeroName {
	m := make(map[string]ZeroName, len(ZeroNames))
	for _, n := range ZeroNames {
		m[n.Prom] = n
	}
	return m
}()

// renamer gives the bridged metrics that zero-cache has their zero-cache
// names.
type renamer struct{ sdkmetric.Producer }

func (r renamer) Produce(ctx context.Context) ([]metricdata.ScopeMetrics, error) {
	sms, err := r.Producer.Produce(ctx)
	for i := range sms {
		for j := range sms[i].Metrics {
			m := &sms[i].Metrics[j]
			if n, ok := zeroByProm[m.Name]; ok {
				m.Name, m.Unit = n.Zero, n.Unit
			}
		}
	}
	return sms, err
}
