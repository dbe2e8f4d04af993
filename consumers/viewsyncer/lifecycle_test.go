package viewsyncer

import (
	"context"
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/cvrstore"
)

// slowDropStore holds a Drop until released, as a store whose NATS round
// trip hangs would.
type slowDropStore struct {
	failingStore
	dropping chan struct{}
	release  chan struct{}
}

func (s *slowDropStore) Drop(ctx context.Context, c *cvrstore.CVR) {
	s.dropping <- struct{}{}
	<-s.release
	s.failingStore.Drop(ctx, c)
}

// TestServer_DropOutsideServerLock checks that dropping a broken group's
// store copy keeps the server's lock free, so other groups connect
// meanwhile, while a client of the dropped group waits for the drop to end
// before its group loads again.
func TestServer_DropOutsideServerLock(t *testing.T) {
	issues := 2 * partSize
	var st *slowDropStore
	e := newEnv(t, envOptions{issues: issues, wrapStore: func(s cvrStore) cvrStore {
		st = &slowDropStore{failingStore: failingStore{cvrStore: s}, dropping: make(chan struct{}, 1), release: make(chan struct{})}
		return st
	}})
	released := false
	release := func() {
		if !released {
			released = true
			close(st.release)
		}
	}
	defer release()
	all := `{"table":"issue","orderBy":[["id","asc"]]}`

	a := connect(t, e, dialOpts{group: "broken", client: "a", init: initFrame(testSchema)})
	a.hydrated()
	st.fail.Store(true)
	a.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("q", all, 0) + `]}]`)
	select {
	case <-st.dropping:
	case <-time.After(30 * time.Second):
		t.Fatal("the broken group was never dropped")
	}
	st.fail.Store(false)

	loaded := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := e.srv.group(ctx, "broken")
		loaded <- err
	}()

	// Another group is served while the drop hangs.
	b := connect(t, e, dialOpts{group: "other", client: "b", init: initFrame(testSchema)})
	b.hydrated()
	select {
	case err := <-loaded:
		t.Fatalf("the dropped group loaded again during its drop (err %v)", err)
	default:
	}

	release()
	select {
	case err := <-loaded:
		if err != nil {
			t.Fatalf("load after the drop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the dropped group did not load after its drop")
	}
}
