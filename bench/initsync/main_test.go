package main

import (
	"math"
	"testing"
	"time"
)

var scaleRows = []float64{451020, 1353020, 4510020}

func TestGrowth(t *testing.T) {
	for _, c := range []struct {
		name string
		y    func(x float64) float64
		met  bool
	}{
		{"linear with a fixed cost", func(x float64) float64 { return 0.3 + x/1e6 }, true},
		{"n log n", func(x float64) float64 { return x * math.Log(x) }, true},
		{"n squared", func(x float64) float64 { return x * x }, false},
		{"n^1.5", func(x float64) float64 { return math.Pow(x, 1.5) }, false},
		{"flat", func(float64) float64 { return 200 }, true},
	} {
		ys := make([]float64, len(scaleRows))
		for i, x := range scaleRows {
			ys[i] = c.y(x)
		}
		g := growth(scaleRows, ys)
		if met := g > 0 && g <= growthTolerance; met != c.met {
			t.Errorf("%s: growth %.3f, met %v; want %v", c.name, g, met, c.met)
		}
	}
	// A middle figure below the smallest is noise: the largest is held to
	// the middle one, not to a line falling through zero.
	if g := growth(scaleRows, []float64{300, 280, 300}); math.Abs(g-300.0/280) > 1e-9 {
		t.Errorf("falling line: growth %.3f; want %.3f", g, 300.0/280)
	}
}

func TestLineFit(t *testing.T) {
	ys := make([]float64, len(scaleRows))
	for i, x := range scaleRows {
		ys[i] = 0.4 + x/700000
	}
	a, b := lineFit(scaleRows, ys)
	if math.Abs(a-0.4) > 1e-9 || math.Abs(1/b-700000) > 1e-3 {
		t.Fatalf("lineFit: %v + x/%v; want 0.4 + x/700000", a, 1/b)
	}
}

func TestZeroCacheHydration(t *testing.T) {
	for _, c := range []struct {
		issues   int
		ms       int64
		measured bool
	}{{100000, 2400, true}, {300000, 7100, true}, {1000000, 23550, false}} {
		d, measured := zcHydration(c.issues)
		if d != time.Duration(c.ms)*time.Millisecond || measured != c.measured {
			t.Errorf("zcHydration(%d) = %v, %v; want %d ms, %v", c.issues, d, measured, c.ms, c.measured)
		}
	}
}
