package viewsyncer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/promreg"
)

type metrics struct {
	connections prometheus.Gauge
	pokes       prometheus.Counter
	advances    prometheus.Counter
	closedSlow  prometheus.Counter
	hydrations  prometheus.Counter
	fallbacks   prometheus.Counter
	idleSyncs   prometheus.Counter
	rowsRead    prometheus.Counter
	refused     *prometheus.CounterVec

	// zero-cache's metrics, named as
	// zero.<category>.<name> is on a Prometheus endpoint.
	lockWait             prometheus.Histogram
	pipelineResets       *prometheus.CounterVec
	transformations      *prometheus.CounterVec
	transformTime        prometheus.Histogram
	transformHashChanges prometheus.Counter
	transformNoOps       prometheus.Counter
	queries              prometheus.Gauge
	rows                 prometheus.Gauge
	groupQueries         prometheus.Histogram
	groupRows            prometheus.Histogram
	pushes               prometheus.Counter
	customMutations      prometheus.Counter
	crudMutations        prometheus.Counter
	pokeTime             prometheus.Histogram
	advanceTime          prometheus.Histogram
	hydrationTime        prometheus.Histogram
	groups               prometheus.Gauge
	leases               prometheus.Gauge
}

// latencyBuckets are zero-cache's latency histogram bounds, in seconds.
var latencyBuckets = []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "zero", Subsystem: "sync", Name: "active_clients",
			Help: "Open sync websockets, relayed ones included (zero.sync.active-clients).",
		}),
		pokes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "sync", Name: "poke_transactions_total",
			Help: "Pokes sent to clients, one per connection poked (zero.sync.poke.transactions).",
		}),
		pokeTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "zero", Subsystem: "sync", Name: "poke_time_seconds",
			Help:    "Time to poke a client group's connections after an update (zero.sync.poke.time).",
			Buckets: latencyBuckets,
		}),
		advanceTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "zero", Subsystem: "sync", Name: "advance_time_seconds",
			Help:    "Time to advance a client group's queries to a new replica state, its poke included (zero.sync.advance-time).",
			Buckets: latencyBuckets,
		}),
		hydrationTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "zero", Subsystem: "sync", Name: "hydration_time_seconds",
			Help:    "Time to hydrate a query (zero.sync.hydration-time).",
			Buckets: latencyBuckets,
		}),
		groups: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "zero", Subsystem: "sync", Name: "active_client_groups",
			Help: "Client groups loaded (zero.sync.active-client-groups).",
		}),
		leases: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "jetsync", Subsystem: "cvr", Name: "leases",
			Help: "Client group leases this view-syncer holds in the CVR key-value bucket.",
		}),
		crudMutations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "mutation", Name: "crud_total",
			Help: "CRUD mutations processed (zero.mutation.crud).",
		}),
		advances: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "advances_total",
			Help: "Replica advances processed.",
		}),
		closedSlow: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "slow_clients_closed_total",
			Help: "Connections closed because their send queue overflowed, or held the most of the server's send budget when it ran out.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "refused_total",
			Help: "Connections and query changes refused at a bound, by reason: connections, memory, queries.",
		}, []string{"reason"}),
		hydrations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "sync", Name: "hydration_total",
			Help: "Full query hydrations: new queries, and re-runs after a reset or a rules or schema change (zero.sync.hydration).",
		}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "query_update_fallbacks_total",
			Help: "Incremental query updates that re-ran the whole query instead.",
		}),
		idleSyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "idle_syncs_total",
			Help: "Client group syncs that changed none of the group's rows or queries: its CVR is not written, nor its clients poked.",
		}),
		rowsRead: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "jetsync", Subsystem: "sync", Name: "replica_rows_read_total",
			Help: "Replica rows read to hydrate and update queries.",
		}),
		lockWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "zero", Subsystem: "sync", Name: "lock_wait_time_seconds",
			Help:    "Time spent waiting to acquire a client group's lock (zero.sync.lock-wait-time).",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5},
		}),
		pipelineResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "sync", Name: "pipeline_resets_total",
			Help: "Pipeline resets, by reason (zero.sync.pipeline-resets).",
		}, []string{"reason"}),
		transformations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "sync", Name: "query_transformations_total",
			Help: "Synced-query transform requests, by result (zero.sync.query.transformations).",
		}, []string{"result"}),
		transformTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "zero", Subsystem: "sync", Name: "query_transformation_time_seconds",
			Help:    "Time of synced-query transform requests (zero.sync.query.transformation-time).",
			Buckets: prometheus.ExponentialBuckets(.001, 2.5, 10),
		}),
		transformHashChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "sync", Name: "query_transformation_hash_changes_total",
			Help: "Re-transforms whose AST changed, replacing the pipeline (zero.sync.query.transformation-hash-changes).",
		}),
		transformNoOps: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "sync", Name: "query_transformation_no_ops_total",
			Help: "Re-transforms with an unchanged AST (zero.sync.query.transformation-no-ops).",
		}),
		queries: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "zero", Subsystem: "sync", Name: "queries",
			Help: "Queries of the loaded client groups' CVRs (zero.sync.queries).",
		}),
		rows: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "zero", Subsystem: "sync", Name: "rows",
			Help: "Rows of the loaded client groups' CVRs (zero.sync.rows).",
		}),
		groupQueries: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "zero", Subsystem: "sync", Name: "client_group_queries",
			Help:    "Queries per client group, observed at each CVR flush.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		groupRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "zero", Subsystem: "sync", Name: "client_group_rows",
			Help:    "Rows per client group, observed at each CVR flush.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 12),
		}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "mutation", Name: "pushes_total",
			Help: "Pushes of custom mutations forwarded to the mutate endpoint (zero.mutation.pushes).",
		}),
		customMutations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "zero", Subsystem: "mutation", Name: "custom_total",
			Help: "Custom mutations forwarded to the mutate endpoint (zero.mutation.custom).",
		}),
	}
	// A second Server on the same registry (tests, an in-process restart)
	// counts into the collectors registered first.
	for _, err := range []error{
		promreg.Register(reg, &m.connections, &m.queries, &m.rows, &m.groups, &m.leases),
		promreg.Register(reg, &m.pokes, &m.advances, &m.closedSlow, &m.hydrations, &m.fallbacks, &m.idleSyncs, &m.rowsRead,
			&m.transformHashChanges, &m.transformNoOps, &m.pushes, &m.customMutations, &m.crudMutations),
		promreg.Register(reg, &m.lockWait, &m.transformTime, &m.groupQueries, &m.groupRows, &m.pokeTime, &m.advanceTime, &m.hydrationTime),
		promreg.Register(reg, &m.pipelineResets, &m.transformations, &m.refused),
	} {
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}
