package main

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jetsync/jetsync/internal/logkey"
)

// demoWeb holds the demo page when `make` has bundled web/demo into
// demoweb/; a plain `go build` embeds only the folder's README, and the page
// is then a note saying how to build it.
//
//go:embed demoweb
var demoWeb embed.FS

// demoPageBuilt reports whether the bundle is embedded.
func demoPageBuilt() bool {
	_, err := fs.Stat(demoWeb, "demoweb/index.html")
	return err == nil
}

const demoNotBuilt = `<!doctype html><meta charset="utf-8"><title>jetsync demo</title>
<body style="font-family: system-ui, sans-serif; max-width: 40em; margin: 3em auto">
<h1>jetsync</h1>
<p>This binary was built without the demo page. Build it with <code>make build</code>
(or <code>make run</code>), which bundles <code>web/demo</code> with esbuild from npm and embeds it.</p>
<p>The sync endpoint is <code>/sync/v51/connect</code>.</p>
`

// demoPage serves the demo page at /demo (index.html) and its assets under
// /demo/, from the embedded bundle.
func demoPage() http.Handler {
	sub, _ := fs.Sub(demoWeb, "demoweb")
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/demo"), "/")
		if name == "" || name == "index.html" || !demoPageBuilt() {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-cache")
			if !demoPageBuilt() {
				_, _ = w.Write([]byte(demoNotBuilt))
				return
			}
			b, _ := fs.ReadFile(sub, "index.html")
			_, _ = w.Write(b)
			return
		}
		if name == "README.md" {
			http.NotFound(w, r)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + name
		files.ServeHTTP(w, r2)
	})
}

// wantsHTML tells a browser loading a page from the other GETs of / (the
// readiness checks of load balancers, tests and curl), which keep their
// plain answers.
func wantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

// serveDemoPage adds the demo page to h: at /demo, and at / too (for
// browsers) when atRoot.
func serveDemoPage(h *httpServer, atRoot bool) {
	page := demoPage()
	// Exact patterns: "/demo/" would overlap the sync endpoint's
	// "/{base}/sync/...".
	for _, p := range []string{"GET /demo", "GET /demo/{$}", "GET /demo/{file}"} {
		h.Handle(p, page)
	}
	if atRoot {
		h.rootPage = page
	}
}

// serveDemo adds the demo page to h and, unless ZERO_MUTATE_URL is set, the
// built-in push endpoint for its custom mutators against upstream,
// pointing the view-syncer at it.
func serveDemo(ctx context.Context, h *httpServer, a *syncFlags, upstream, shardSchema string, atRoot bool, log *slog.Logger) (func(), error) {
	serveDemoPage(h, atRoot)
	closeAPI := func() {}
	if len(a.api.Mutate.URLs) == 0 {
		api, err := newDemoAPI(ctx, upstream, shardSchema, log.With(logkey.Component, "demo-api"))
		if err != nil {
			return nil, err
		}
		closeAPI = api.Close
		h.Handle("POST "+demoMutatePath, api)
		a.api.Mutate.URLs = []string{fmt.Sprintf("http://127.0.0.1:%d%s", h.Port(), demoMutatePath)}
	}
	logDemoPage(h, a, atRoot, log)
	return closeAPI, nil
}

func logDemoPage(h *httpServer, a *syncFlags, atRoot bool, log *slog.Logger) {
	url := fmt.Sprintf("http://127.0.0.1:%d/", h.Port())
	if !atRoot {
		url += "demo"
	}
	switch {
	case !demoPageBuilt():
		log.Info("demo page not built (make build bundles it); its place holds a note", "url", url)
	case len(a.api.Mutate.URLs) == 0:
		log.Info("demo page: open it in a browser; its edits need ZERO_MUTATE_URL (jetsync demo-api serves one)", "url", url)
	default:
		log.Info("demo page: open it in a browser", "url", url, "mutate_url", a.api.Mutate.URLs[0])
	}
}
