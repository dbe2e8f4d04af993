package streams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Backups: replica snapshots in an object store, the backup's progress and
// verified state in a KV bucket, and restore reservations (plus the purge
// lock) in a KV bucket whose keys expire on their own. README.md, section
// "Backups", documents them.

// SnapshotBucket is the object store holding replica snapshots.
func (s Shard) SnapshotBucket() string { return "jetsync_" + s.ID() + "_snapshots" }

// SnapshotChunks is the subject of the chunks of the snapshot object whose
// NUID is nuid, as JetStream's object store names them; with nuid "" it is
// the prefix of every object's chunk subject.
func (s Shard) SnapshotChunks(nuid string) string {
	return "$O." + s.SnapshotBucket() + ".C." + nuid
}

// BackupBucket is the KV bucket holding the backup's claimed progress
// (KeyBackupClaimed) and its newest verified snapshot (KeyBackupVerified).
func (s Shard) BackupBucket() string { return "jetsync_" + s.ID() + "_backup" }

// ReservationBucket is the KV bucket holding restore reservations and the
// purge lock. Its keys carry a per-message TTL, so that a crashed holder's
// key goes away by itself.
func (s Shard) ReservationBucket() string { return "jetsync_" + s.ID() + "_reservations" }

// BackupNowSubject is the core NATS request subject on which `jetsync backup
// now` asks the producer for a snapshot. The reply is a BackupNowReply.
func (s Shard) BackupNowSubject() string { return s.Prefix() + ".control.backup" }

// Keys of the backup bucket.
const (
	// KeyBackupClaimed holds the newest Snapshot the producer believes it
	// uploaded: a claim, which purges never trust alone.
	KeyBackupClaimed = "claimed"
	// KeyBackupVerified holds the newest Snapshot found complete in the
	// object store with a matching digest: the one restorers use.
	KeyBackupVerified = "verified"
)

// KeyPurgeLock is the reservation bucket key a starting producer creates
// (revision-checked) while it restores its own replica; no purge runs while
// another holder's lock is live.
const KeyPurgeLock = "purge-lock"

// KeyReservation is the reservation bucket key of a restorer's reservation.
func KeyReservation(taskID string) string { return "reserve." + taskID }

// ReservationPrefix starts every reservation key.
const ReservationPrefix = "reserve."

// MetaProtect is the consumer metadata key that, set to "true", keeps the
// change stream from being purged past that durable consumer's ack floor
// (for as long as it lags less than the producer's protect max lag).
const MetaProtect = "jetsync.protect"

// MetaReplica is the consumer metadata key that, set to "true", marks the
// durable consumer of a jetsync SQLite replica (a view-syncer, replicator or
// backup replica): while it has a pull outstanding, the change stream is
// never purged past its ack floor.
const MetaReplica = "jetsync.replica"

// DefaultReservationTTL is how long a reservation or purge lock lives
// without a heartbeat.
const DefaultReservationTTL = 90 * time.Second

// Snapshot describes one replica snapshot object. Its fields are also the
// object's metadata, so a listing alone describes every snapshot.
type Snapshot struct {
	// Name is the object's name, SnapshotName(ReplicaVersion, Watermark).
	Name           string `json:"name"`
	ReplicaVersion string `json:"replicaVersion"`
	// Watermark is the last transaction the snapshot holds.
	Watermark string `json:"watermark"`
	// StreamSeq is the change stream sequence of the last message the
	// snapshot holds: catch-up starts at StreamSeq+1.
	StreamSeq   uint64 `json:"streamSeq"`
	WriteTimeMs int64  `json:"writeTimeMs,omitempty"`
	// SHA256 is the hex SHA-256 of the SQLite file.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// TakenAt is when the snapshot was taken, by the producer's clock.
	TakenAt time.Time `json:"takenAt"`
	// Rows is how many rows the replica's tables held, for a restore's
	// progress in rows; 0 when the snapshot predates it.
	Rows int64 `json:"rows,omitempty"`
	// ClaimedAt is when the producer finished uploading it (in claims and
	// verified records only).
	ClaimedAt time.Time `json:"claimedAt,omitzero"`
}

// SnapshotName is the object name of a snapshot: "<replicaVersion>/<watermark>".
// Watermarks sort as strings, so names sort by age within a replica version.
func SnapshotName(replicaVersion, watermark string) string {
	return replicaVersion + "/" + watermark
}

// Object metadata keys of a snapshot.
const (
	metaReplicaVersion = "replica-version"
	metaWatermark      = "watermark"
	metaStreamSeq      = "stream-seq"
	metaWriteTimeMs    = "write-time-ms"
	metaSHA256         = "sha256"
	metaSize           = "size"
	metaTakenAt        = "taken-at"
	metaRows           = "rows"
)

// Metadata is s as object metadata.
func (s Snapshot) Metadata() map[string]string {
	return map[string]string{
		metaReplicaVersion: s.ReplicaVersion,
		metaWatermark:      s.Watermark,
		metaStreamSeq:      strconv.FormatUint(s.StreamSeq, 10),
		metaWriteTimeMs:    strconv.FormatInt(s.WriteTimeMs, 10),
		metaSHA256:         s.SHA256,
		metaSize:           strconv.FormatInt(s.Size, 10),
		metaTakenAt:        s.TakenAt.UTC().Format(time.RFC3339Nano),
		metaRows:           strconv.FormatInt(s.Rows, 10),
	}
}

// ErrNotSnapshot reports an object that is not a well-formed snapshot.
var ErrNotSnapshot = errors.New("not a snapshot object")

// SnapshotFromInfo reads a snapshot's description from its object info.
func SnapshotFromInfo(info *jetstream.ObjectInfo) (Snapshot, error) {
	m := info.Metadata
	s := Snapshot{Name: info.Name, ReplicaVersion: m[metaReplicaVersion], Watermark: m[metaWatermark], SHA256: m[metaSHA256]}
	var err error
	if s.StreamSeq, err = strconv.ParseUint(m[metaStreamSeq], 10, 64); err != nil {
		return s, fmt.Errorf("%s: %w: stream seq %q", info.Name, ErrNotSnapshot, m[metaStreamSeq])
	}
	s.WriteTimeMs, _ = strconv.ParseInt(m[metaWriteTimeMs], 10, 64)
	s.Rows, _ = strconv.ParseInt(m[metaRows], 10, 64) // absent from older snapshots
	if s.Size, err = strconv.ParseInt(m[metaSize], 10, 64); err != nil {
		return s, fmt.Errorf("%s: %w: size %q", info.Name, ErrNotSnapshot, m[metaSize])
	}
	if s.TakenAt, err = time.Parse(time.RFC3339Nano, m[metaTakenAt]); err != nil {
		return s, fmt.Errorf("%s: %w: taken at %q", info.Name, ErrNotSnapshot, m[metaTakenAt])
	}
	if s.ReplicaVersion == "" || s.Watermark == "" || len(s.SHA256) != 64 {
		return s, fmt.Errorf("%s: %w", info.Name, ErrNotSnapshot)
	}
	return s, nil
}

// Reservation is a restorer's record in the reservation bucket, under
// KeyReservation(TaskID). While one is live the producer purges nothing.
type Reservation struct {
	TaskID string    `json:"taskID"`
	Start  time.Time `json:"start"`
	// Beat counts heartbeats, so that every refresh changes the value.
	Beat uint64 `json:"beat"`
	// Ended is set when the restorer caught up; Duration is then how long
	// the reservation was held, which raises the producer's cleanup delay.
	Ended    bool          `json:"ended,omitempty"`
	Duration time.Duration `json:"duration,omitempty"`
}

// PurgeLock is the record under KeyPurgeLock.
type PurgeLock struct {
	Holder string    `json:"holder"`
	Since  time.Time `json:"since"`
	Beat   uint64    `json:"beat"`
}

// BackupNowReply answers a request on BackupNowSubject.
type BackupNowReply struct {
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// SnapshotStoreConfig is the snapshot object store's definition.
func (c Config) SnapshotStoreConfig() jetstream.ObjectStoreConfig {
	return jetstream.ObjectStoreConfig{
		Bucket:      c.Shard.SnapshotBucket(),
		Description: "jetsync replica snapshots for shard " + c.Shard.ID(),
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
	}
}

// BackupBucketConfig is the backup bucket's definition.
func (c Config) BackupBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      c.Shard.BackupBucket(),
		Description: "jetsync backup progress for shard " + c.Shard.ID(),
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		History:     16,
	}
}

// ReservationBucketConfig is the reservation bucket's definition.
// LimitMarkerTTL turns on per-message TTLs (nats-server 2.11+).
func (c Config) ReservationBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         c.Shard.ReservationBucket(),
		Description:    "jetsync restore reservations and purge lock for shard " + c.Shard.ID(),
		Storage:        jetstream.FileStorage,
		Replicas:       max(c.Replicas, 1),
		History:        1,
		LimitMarkerTTL: time.Second,
	}
}

// Backup holds the backup resources of one shard.
type Backup struct {
	Snapshots    jetstream.ObjectStore
	State        jetstream.KeyValue
	Reservations jetstream.KeyValue
}

// EnsureBackup creates the snapshot object store and the backup and
// reservation buckets, or brings existing ones to this definition.
func EnsureBackup(ctx context.Context, js jetstream.JetStream, c Config) (Backup, error) {
	var b Backup
	if err := c.Shard.Validate(); err != nil {
		return b, err
	}
	c, err := c.WithReplicas(ctx, js)
	if err != nil {
		return b, err
	}
	if b.Snapshots, err = js.CreateOrUpdateObjectStore(ctx, c.SnapshotStoreConfig()); err != nil {
		return b, fmt.Errorf("ensure object store %s: %w", c.Shard.SnapshotBucket(), err)
	}
	if b.State, err = js.CreateOrUpdateKeyValue(ctx, c.BackupBucketConfig()); err != nil {
		return b, fmt.Errorf("ensure bucket %s: %w", c.Shard.BackupBucket(), err)
	}
	if b.Reservations, err = js.CreateOrUpdateKeyValue(ctx, c.ReservationBucketConfig()); err != nil {
		return b, fmt.Errorf("ensure bucket %s: %w", c.Shard.ReservationBucket(), err)
	}
	return b, nil
}

// PutWithTTL writes value under key in bucket with a per-message TTL, which
// KeyValue.Put cannot do: a heartbeat that stops lets the key expire.
func PutWithTTL(ctx context.Context, js jetstream.JetStream, bucket, key string, value []byte, ttl time.Duration) (uint64, error) {
	ack, err := js.Publish(ctx, "$KV."+bucket+"."+key, value, jetstream.WithMsgTTL(ttl))
	if err != nil {
		return 0, fmt.Errorf("put %s/%s: %w", bucket, key, err)
	}
	return ack.Sequence, nil
}

// ReadSnapshot reads a Snapshot record (KeyBackupClaimed or
// KeyBackupVerified) from the backup bucket; ok is false when there is none.
func ReadSnapshot(ctx context.Context, kv jetstream.KeyValue, key string) (s Snapshot, ok bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("read %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return s, false, fmt.Errorf("read %s: %w", key, err)
	}
	return s, true, nil
}
