package auth_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/auth/authtest"
)

// apiServer stands in for the view-syncer's effects: it rejects client b's token.
type apiServer struct{}

func (apiServer) Revalidate(_ context.Context, c conn) (auth.Validation, error) {
	fmt.Println("revalidate", c.ClientID)
	if c.Auth == "token-b" {
		return auth.Validation{}, auth.AuthError(fmt.Errorf("TransformFailed: http 401"))
	}
	return auth.Validation{}, nil
}

func (apiServer) Retransform(_ context.Context, c conn) (*auth.Validation, error) {
	fmt.Println("retransform with", c.ClientID)
	return &auth.Validation{}, nil
}

func (apiServer) FailConnection(c conn, err error) { fmt.Println("fail", c.ClientID+":", err) }

func Example() {
	clock := authtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	wake := make(chan struct{}, 1)
	m, _ := auth.NewManager[string, string, string](auth.ManagerConfig{
		RevalidateInterval:  auth.DefaultRevalidateInterval,
		RetransformInterval: auth.DefaultRetransformInterval,
		Clock:               clock,
		Logger:              quiet,
		// A view-syncer queues the wake-up for its group lock.
		Wake: func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		},
	})
	for _, id := range []string{"a", "b"} {
		s := auth.Selector{ClientID: id, WSID: "ws1"}
		m.Register(s, auth.UserOf("u1"), "token-"+id, "query-ctx", "mutate-ctx")
		c, _ := m.InitConnection(s, "query-ctx", "mutate-ctx")
		m.Validate(s, c.Revision, auth.Validation{}) // after the initConnection check
	}
	m.SetRetransformReady(true) // pipelines synced
	at, _ := m.NextWake()
	fmt.Println("wake after", at.Sub(clock.Now()))

	clock.Advance(5 * time.Minute)
	<-wake
	if err := m.Maintain(context.Background(), apiServer{}); err != nil {
		fmt.Println("fatal:", err)
	}
	bg, _ := m.Background()
	fmt.Println("background", bg.ClientID, "connections", len(m.Conns()))
	// Output:
	// wake after 5m0s
	// revalidate a
	// revalidate b
	// fail b: TransformFailed: http 401
	// retransform with a
	// background a connections 1
}
