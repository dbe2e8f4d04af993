package replicator

import "github.com/jetsync/jetsync/internal/logkey"

// rereadFirst reports whether a gap should first be answered by reading
// again from the replica's position, rather than by a rebuild. A NATS
// server that restarts drops what was on the wire to this client, yet
// counts it delivered, and goes on with later messages: to the processor
// that looks like history missing. Read again over a new durable consumer,
// the stream either has the message (a delivery lost) or meets the same
// gap at the same place (history lost), which then rebuilds the replica.
func (c *Consumer) rereadFirst(gap *GapError) bool {
	if gap.Seq == c.rereadGap {
		return false
	}
	c.rereadGap = gap.Seq
	c.log.Warn("change stream gap; reading again from the replica's position before rebuilding it",
		logkey.Seq, gap.Seq, "reason", gap.Reason, "from", c.proc.st.StreamSeq+1)
	return true
}
