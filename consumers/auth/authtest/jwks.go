package authtest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// JWKSServer serves a key set the test can change, counting requests.
type JWKSServer struct {
	*httptest.Server
	Hits   atomic.Int64
	mu     sync.Mutex
	keys   []string
	status int
	gate   chan struct{} // if set, requests wait for it to close
}

// NewJWKSServer serves keys (JSON Web Keys) as a set until t ends.
func NewJWKSServer(t *testing.T, keys ...string) *JWKSServer {
	s := &JWKSServer{keys: keys, status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Hits.Add(1)
		s.mu.Lock()
		status, body, gate := s.status, `{"keys":[`+strings.Join(s.keys, ",")+`]}`, s.gate
		s.mu.Unlock()
		if gate != nil {
			<-gate
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s
}

// Set makes the server answer status with keys from now on.
func (s *JWKSServer) Set(status int, keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.keys = status, keys
}

// Gate makes requests from now on wait until gate is closed.
func (s *JWKSServer) Gate(gate chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = gate
}
