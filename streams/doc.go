// Package streams is jetsync's contract between producers and consumers: the
// subject scheme, the change-message encoding, and the JetStream stream and KV
// bucket definitions. README.md beside this file documents it for analytics
// consumers; keep the two in step.
//
// It imports nothing of jetsync's (only nats.go), so any Go program can decode the change
// stream with it alone.
package streams
