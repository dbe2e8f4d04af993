// Package logkey names the log attributes that identify jetsync's nouns, so
// that one thing is logged under one key in every component, and one key
// means one thing: a search for client_group=cg1 finds the client group's
// lines from the view-syncer and from the CVR store alike.
//
// Attributes that only measure or explain (took, rows, reason, ...) stay
// literals at their one call site, and so does "err", slog's own
// convention, everywhere.
package logkey

// Zero's nouns, named as zero-cache names them where it logs them.
const (
	ClientGroup = "client_group" // a client group's ID
	Client      = "client"       // a Zero client's ID (not a network peer)
	WSID        = "wsid"         // a sync connection's ID, the client's wsid parameter
	Query       = "query"        // a query's hash
)

// The change stream's and the replica's nouns.
const (
	Seq            = "seq"             // a JetStream stream sequence
	Watermark      = "watermark"       // a commit's watermark in the change stream
	ReplicaVersion = "replica_version" // the replica version of an initial sync
	Snapshot       = "snapshot"        // a replica snapshot's name in the object store
	Stream         = "stream"          // a JetStream stream's name
	Subject        = "subject"         // a NATS subject
	Consumer       = "consumer"        // a JetStream consumer's name
	Table          = "table"           // an upstream table, schema-qualified where known
	Slot           = "slot"            // a Postgres replication slot
	LSN            = "lsn"             // a Postgres log sequence number
	Shard          = "shard"           // a shard's ID
)

// The processes' nouns.
const (
	Component = "component" // the part of a process that logs
	TaskID    = "task_id"   // a process's task ID (ZERO_TASK_ID or the data directory's)
	Instance  = "instance"  // a change-streamer's instance, in the producer role lease
	Owner     = "owner"     // the view-syncer that owns a client group
)
