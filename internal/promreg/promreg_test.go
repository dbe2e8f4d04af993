package promreg_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/promreg"
)

func TestRegister(t *testing.T) {
	newCounter := func() prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "jetsync_test_total", Help: "A test counter."})
	}
	t.Run("ReusesIdentical", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		first := newCounter()
		if err := promreg.Register(reg, &first); err != nil {
			t.Fatal(err)
		}
		second := newCounter()
		if err := promreg.Register(reg, &second); err != nil {
			t.Fatalf("Register(identical) = %v; want nil", err)
		}
		if second != first {
			t.Error("Register(identical) left the new counter in place; want the registered one")
		}
	})
	t.Run("RejectsConflicting", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		c := newCounter()
		if err := promreg.Register(reg, &c); err != nil {
			t.Fatal(err)
		}
		// Same name, other help: the registry refuses it outright.
		other := prometheus.NewCounter(prometheus.CounterOpts{Name: "jetsync_test_total", Help: "Another help."})
		if err := promreg.Register(reg, &other); err == nil {
			t.Error("Register(conflicting) = nil; want an error")
		}
	})
	t.Run("NilRegistry", func(t *testing.T) {
		c := newCounter()
		if err := promreg.Register(nil, &c); err != nil {
			t.Errorf("Register(nil) = %v; want nil", err)
		}
	})
}
