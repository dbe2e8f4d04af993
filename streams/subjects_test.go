package streams

import "testing"

func TestShardNames(t *testing.T) {
	s := Shard{App: "zero", Num: 0}
	for got, want := range map[string]string{
		s.ChangesStream():                   "JETSYNC_zero_0_CHANGES",
		s.ChangesFilter():                   "jetsync.zero_0.changes.>",
		s.TableSubject("public", "issue"):   "jetsync.zero_0.changes.public.issue",
		s.TableSubject("my schema", "a.b*"): "jetsync.zero_0.changes.my%20schema.a%2Eb%2A",
		s.TxSubject():                       "jetsync.zero_0.changes.tx",
		s.StateBucket():                     "jetsync_zero_0_state",
	} {
		if got != want {
			t.Errorf("got %q; want %q", got, want)
		}
	}
	if err := (Shard{App: "Bad-App"}).Validate(); err == nil {
		t.Error("Validate accepted an upper-case app id")
	}
}
