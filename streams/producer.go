package streams

import "time"

// KeyProducer is the state bucket key of the producer role: the record of
// the one change-streamer that may publish to the change stream. Writes to it
// are revision-checked. A change-streamer that starts takes the role from
// whoever holds it (the newest one wins, as zero-cache's replication owner
// does); the one that lost it stops. The change stream's expected last
// sequence remains the fence for a publish already in flight.
const KeyProducer = "producer"

// Producer is the record under KeyProducer.
type Producer struct {
	TaskID string `json:"taskID"`
	// Instance tells apart two processes with the same task ID: it is new
	// each time a process takes the role.
	Instance string `json:"instance"`
	// Started is when this holder took the role.
	Started time.Time `json:"started"`
	// Expires is when the record goes stale unless its holder renews it. A
	// stale record only says that its holder is probably gone: the role is
	// taken over the same way either way.
	Expires time.Time `json:"expires"`
	// Beat counts renewals.
	Beat uint64 `json:"beat"`
}
