package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// metricSet is what /metrics serves, and what the OTLP export reads: one
// registry per component, merged on each scrape, every series with a
// component label. A name belongs to one component
// (TestMetricNames_PrometheusConventions); the process and Go runtime
// metrics are the one shared family set.
type metricSet struct {
	mu    sync.Mutex
	regs  []*prometheus.Registry
	names []string
}

func newMetricSet() *metricSet {
	s := &metricSet{}
	base := prometheus.NewRegistry()
	base.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		heapPeakCollector(),
	)
	s.regs, s.names = append(s.regs, base), append(s.names, "process")
	return s
}

// For returns the registerer a component registers its metrics on.
func (s *metricSet) For(component string) prometheus.Registerer {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := prometheus.NewRegistry()
	s.regs, s.names = append(s.regs, r), append(s.names, component)
	return prometheus.WrapRegistererWith(prometheus.Labels{"component": component}, r)
}

// Gather merges the components' families by name.
func (s *metricSet) Gather() ([]*dto.MetricFamily, error) {
	s.mu.Lock()
	regs, names := slices.Clone(s.regs), slices.Clone(s.names)
	s.mu.Unlock()
	var (
		out   []*dto.MetricFamily
		errs  []error
		index = map[string]int{}
	)
	for i, r := range regs {
		mfs, err := r.Gather()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", names[i], err))
		}
		for _, mf := range mfs {
			j, ok := index[mf.GetName()]
			if !ok {
				index[mf.GetName()] = len(out)
				out = append(out, mf)
				continue
			}
			if out[j].GetType() != mf.GetType() {
				errs = append(errs, fmt.Errorf("%s: metric %s is a %s here and a %s elsewhere", names[i], mf.GetName(), mf.GetType(), out[j].GetType()))
				continue
			}
			out[j].Metric = append(out[j].Metric, mf.Metric...)
		}
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, errors.Join(errs...)
}
