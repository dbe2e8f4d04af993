// Package promreg registers Prometheus collectors so that a component
// restarted in the same process (a consumer re-run after an error, a test
// starting a second instance on one registry) keeps counting into the
// collectors it registered the first time instead of failing.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers each *c with reg. Where an identical collector is
// already registered, *c is replaced by it, so that updates reach the one
// the registry exposes. A nil reg registers nothing.
func Register[C prometheus.Collector](reg prometheus.Registerer, cs ...*C) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		err := reg.Register(*c)
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				*c = old
				continue
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
