package main

import (
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// heapSampleInterval is how often the heap peak is sampled. The Go heap
// peaks just before each GC cycle ends, so a sampled maximum can miss the
// top of a cycle shorter than this: jetsync_go_heap_goal_peak_bytes, the
// largest heap size the GC aimed to stay under, bounds it from above.
const heapSampleInterval = 50 * time.Millisecond

// Sampled runtime/metrics names: the bytes of heap objects, live or not
// yet swept, and the GC's heap goal.
const (
	heapObjectsMetric = "/memory/classes/heap/objects:bytes"
	heapGoalMetric    = "/gc/heap/goal:bytes"
)

// heapPeak tracks the process's largest Go heap since it started, for
// the large-transaction test (issue 3, point 4) and for operators sizing
// memory limits: the Go collector's gauges show only the heap now. It is
// process-wide, like the runtime it reads.
type heapPeak struct {
	objects, goal atomic.Uint64
	samples       []metrics.Sample
	mu            sync.Mutex // guards samples
}

var (
	processHeapPeak     = &heapPeak{}
	startHeapPeakOnce   sync.Once
	heapPeakDescObjects = prometheus.NewDesc("jetsync_go_heap_peak_bytes",
		"Largest Go heap (runtime/metrics "+heapObjectsMetric+") seen since the process started, sampled every 50 ms.", nil, nil)
	heapPeakDescGoal = prometheus.NewDesc("jetsync_go_heap_goal_peak_bytes",
		"Largest GC heap goal (runtime/metrics "+heapGoalMetric+") since the process started: an upper bound of the heap's peak.", nil, nil)
)

// heapPeakCollector starts the process's heap sampler, once, and returns
// its collector. The sampler lives as long as the process: it has no
// state to release and nothing to flush.
func heapPeakCollector() prometheus.Collector {
	startHeapPeakOnce.Do(func() {
		processHeapPeak.sample()
		go func() {
			t := time.NewTicker(heapSampleInterval)
			defer t.Stop()
			for range t.C {
				processHeapPeak.sample()
			}
		}()
	})
	return processHeapPeak
}

func (h *heapPeak) sample() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.samples == nil {
		h.samples = []metrics.Sample{{Name: heapObjectsMetric}, {Name: heapGoalMetric}}
	}
	metrics.Read(h.samples)
	for i, dst := range []*atomic.Uint64{&h.objects, &h.goal} {
		if h.samples[i].Value.Kind() != metrics.KindUint64 {
			continue
		}
		v := h.samples[i].Value.Uint64()
		for old := dst.Load(); v > old && !dst.CompareAndSwap(old, v); old = dst.Load() {
		}
	}
}

// Describe implements prometheus.Collector.
func (h *heapPeak) Describe(ch chan<- *prometheus.Desc) {
	ch <- heapPeakDescObjects
	ch <- heapPeakDescGoal
}

// Collect implements prometheus.Collector. It samples first, so that a
// scrape never reports less than the heap at that moment.
func (h *heapPeak) Collect(ch chan<- prometheus.Metric) {
	h.sample()
	ch <- prometheus.MustNewConstMetric(heapPeakDescObjects, prometheus.GaugeValue, float64(h.objects.Load()))
	ch <- prometheus.MustNewConstMetric(heapPeakDescGoal, prometheus.GaugeValue, float64(h.goal.Load()))
}
