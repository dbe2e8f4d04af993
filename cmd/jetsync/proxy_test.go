package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"
)

// nameServer answers every connection with its name and a newline, then
// echoes what it reads.
func nameServer(t *testing.T, name string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.WriteString(c, name+"\n"); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln
}

func TestProxy_Run(t *testing.T) {
	a, b := nameServer(t, "a"), nameServer(t, "b")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, backends: []string{a.Addr().String(), b.Addr().String()}, dialTimeout: time.Second, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	dial := func() (string, net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "", c
		}
		return line[:len(line)-1], c
	}
	t.Run("RoundRobin", func(t *testing.T) {
		var got []string
		for range 4 {
			name, _ := dial()
			got = append(got, name)
		}
		if want := []string{"a", "b", "a", "b"}; !slices.Equal(got, want) {
			t.Errorf("backends in turn = %v; want %v", got, want)
		}
	})
	t.Run("Echo", func(t *testing.T) {
		_, c := dial()
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping\n" {
			t.Errorf("echo = %q, %v", buf, err)
		}
	})
	t.Run("BackendDown", func(t *testing.T) {
		a.Close()
		for range 3 {
			if name, _ := dial(); name != "b" {
				t.Errorf("with a down, served by %q; want b", name)
			}
		}
	})
	_, open := dial()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v after cancel; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	// Connections in flight are closed.
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := open.Read(make([]byte, 1)); err == nil {
		t.Error("a connection in flight stayed open after the proxy stopped")
	}
}
