package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/jetsync/jetsync/internal/logkey"
)

// notifyContext is cancelled by the first SIGINT or SIGTERM, which starts an
// ordered shutdown. A second one exits at once, for when that shutdown hangs
// (litestream does the same).
func notifyContext(parent context.Context, log *slog.Logger) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			log.Info("shutting down; signal again to exit at once", "signal", sig.String())
			cancel()
		case <-done:
			return
		}
		select {
		case sig := <-ch:
			log.Warn("second signal: exiting without a clean shutdown", "signal", sig.String())
			os.Exit(130)
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
			cancel()
		})
	}
}

// component is a long-lived part: Run blocks until ctx is cancelled and then
// returns nil, or returns an error.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// runStages runs every component of every stage until ctx is done or one of
// them fails. Then it stops the stages in order, each one wholly before the
// next: the producer before the consumers (which finish the batch in hand),
// and those before the HTTP server. It returns the first failure.
func runStages(ctx context.Context, log *slog.Logger, stages ...[]component) error {
	var (
		errOnce  sync.Once
		firstErr error
		failed   = make(chan struct{})
	)
	fail := func(err error) {
		errOnce.Do(func() {
			firstErr = err
			close(failed)
		})
	}
	// Each stage's context keeps ctx's values but not its cancellation, which
	// is handed down stage by stage below.
	base := context.WithoutCancel(ctx)
	cancels := make([]context.CancelFunc, len(stages))
	wgs := make([]sync.WaitGroup, len(stages))
	for i, st := range stages {
		sctx, cancel := context.WithCancel(base)
		cancels[i] = cancel
		for _, c := range st {
			wgs[i].Go(func() {
				err := c.run(sctx)
				switch {
				case sctx.Err() == nil && err == nil:
					fail(fmt.Errorf("%s stopped unexpectedly", c.name))
				case err != nil && !errors.Is(err, context.Canceled):
					fail(fmt.Errorf("%s: %w", c.name, err))
				}
			})
		}
	}
	select {
	case <-ctx.Done():
	case <-failed:
		// The failure itself is returned, and reported by main.
		log.Info("shutting down after a failure")
	}
	for i, st := range stages {
		for _, c := range st {
			log.Debug("stopping", logkey.Component, c.name)
		}
		cancels[i]()
		wgs[i].Wait()
	}
	return firstErr
}
