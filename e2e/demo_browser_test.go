package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/polltest"
)

// TestDemo_Browser opens the demo page that `jetsync run` serves with its demo
// upstream in headless chromium (Debian's, installed by make deps): the real
// @rocicorp/zero client in a browser, on IndexedDB. Two tabs, each in its own
// browser context so that nothing is shared but the server: an edit in one
// (a custom mutator, run by the built-in push endpoint) shows in the other,
// an SQL update shows in both, and a tab that left and came back starts from
// its IndexedDB store and catches up. It takes the screenshot the README
// shows, and saves it as docs/demo.png with -update-screenshot.
func TestDemo_Browser(t *testing.T) {
	chrome := chromiumPath(t)
	dataDir := filepath.Join(dataRoot(t), "data")
	began := time.Now()
	srv := startDemoRun(t, dataDir)
	pgURL := str(t, srv.logRecord(t, "demo upstream ready: connect with psql", 90*time.Second), "url")
	pageURL := str(t, srv.logRecord(t, "demo page: open it in a browser", 30*time.Second), "url")
	httpPort := int(srv.logRecord(t, "http listening", 30*time.Second)["port"].(float64))
	if want := fmt.Sprintf("http://127.0.0.1:%d/", httpPort); pageURL != want {
		t.Fatalf("demo page at %q; want / of the HTTP port, %q", pageURL, want)
	}
	// Readiness keeps its plain answer for everything but a browser.
	polltest.Until(t, 90*time.Second, "GET / to answer 200 OK", func() bool {
		body, code := get(t, pageURL)
		return code == 200 && body == "OK"
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.WithoutCancel(ctx))
	sqlExec := func(t *testing.T, q string, args ...any) {
		t.Helper()
		if _, err := pg.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	tabs := openBrowserTabs(t, ctx, chrome, 2)
	tabA, tabB := tabs[0], tabs[1]
	run, waitJS, eval := browserDo, browserWait, browserEval
	title := demoTitle
	hasTitle := func(id, want string) string { return title(id) + ` === ` + strconv.Quote(want) }
	openIDs := demoOpenIDs

	run(t, tabA, "open tab A", chromedp.Navigate(pageURL))
	run(t, tabB, "open tab B", chromedp.Navigate(pageURL))
	for name, tab := range map[string]context.Context{"tab A": tabA, "tab B": tabB} {
		waitJS(t, tab, name, "connected, with the demo's open issues", `window.jetsyncDemo?.connection === 'connected' && `+openIDs+` === 'i1,i2,i4'`)
		if started, err := eval(tab, `window.jetsyncDemo.baseCookies[0] ?? null`); err != nil || started != nil {
			t.Errorf("%s: first connection's baseCookie = %v, %v; want none on a fresh browser context", name, started, err)
		}
	}
	t.Logf("both tabs synced %.1f s after start", time.Since(began).Seconds())

	t.Run("EditInOneTabShowsInTheOther", func(t *testing.T) {
		run(t, tabA, "select i1 in tab A", chromedp.Click(chromedp.CSS(`#issues li[data-id="i1"]`)))
		waitJS(t, tabA, "tab A", "i1's comments and labels", `document.querySelectorAll('#comments li').length === 2 && document.querySelector('#detail-labels').textContent === 'bug'`)
		run(t, tabA, "edit i1's title in tab A",
			chromedp.SetValue(chromedp.CSS(`#edit-title`), "Edited in tab A"),
			chromedp.Click(chromedp.CSS(`#save-title`)))
		waitJS(t, tabB, "tab B", "tab A's edit", hasTitle("i1", "Edited in tab A"))
		// The server mutator wrote it, with the client's lastMutationID.
		var got string
		var lmid int64
		if err := pg.QueryRow(ctx, `SELECT title FROM issue WHERE id = 'i1'`).Scan(&got); err != nil || got != "Edited in tab A" {
			t.Errorf("Postgres i1 title = %q, %v; want the edit", got, err)
		}
		if err := pg.QueryRow(ctx, `SELECT max("lastMutationID") FROM zero_0.clients`).Scan(&lmid); err != nil || lmid < 1 {
			t.Errorf("zero_0.clients lastMutationID = %d, %v; want the push recorded", lmid, err)
		}

		run(t, tabB, "create an issue in tab B",
			chromedp.SetValue(chromedp.CSS(`#new-title`), "Created in tab B"),
			chromedp.Click(chromedp.CSS(`#create-issue`)))
		created := `Array.from(document.querySelectorAll('#issues li .title')).some(e => e.textContent === 'Created in tab B')`
		waitJS(t, tabA, "tab A", "tab B's new issue", created)
		// Tab B shows what it created; closing it takes it off tab A's list
		// of open issues.
		waitJS(t, tabB, "tab B", "its new issue selected", `document.querySelector('#detail-title').textContent === 'Created in tab B'`)
		run(t, tabB, "close the new issue in tab B", chromedp.Click(chromedp.CSS(`#toggle-open`)))
		waitJS(t, tabA, "tab A", "tab B's issue closed", `!(`+created+`)`)

		run(t, tabA, "comment on i1 in tab A",
			chromedp.SetValue(chromedp.CSS(`#comment-body`), "A comment from tab A"),
			chromedp.Click(chromedp.CSS(`#add-comment`)))
		run(t, tabB, "select i1 in tab B", chromedp.Click(chromedp.CSS(`#issues li[data-id="i1"]`)))
		waitJS(t, tabB, "tab B", "tab A's comment", `Array.from(document.querySelectorAll('#comments li')).some(e => e.textContent.endsWith('A comment from tab A'))`)
	})

	t.Run("SQLUpdateShowsInBoth", func(t *testing.T) {
		sqlExec(t, `UPDATE issue SET title = 'Updated by SQL', modified = $1 WHERE id = 'i2'`, float64(time.Now().UnixMilli()))
		waitJS(t, tabA, "tab A", "the SQL update", hasTitle("i2", "Updated by SQL"))
		waitJS(t, tabB, "tab B", "the SQL update", hasTitle("i2", "Updated by SQL"))
		// An insert shows in both; the time is an upper bound (the test
		// polls each tab in turn).
		committed := time.Now()
		sqlExec(t, `INSERT INTO issue (id, title, open, modified, owner_id, created) VALUES ('s1', 'Inserted by SQL', true, $1, 'u3', now())`, float64(time.Now().UnixMilli()))
		waitJS(t, tabA, "tab A", "the SQL insert", hasTitle("s1", "Inserted by SQL"))
		waitJS(t, tabB, "tab B", "the SQL insert", hasTitle("s1", "Inserted by SQL"))
		t.Logf("an SQL insert showed in both tabs within %v of its commit", time.Since(committed).Round(time.Millisecond))
		// Closing an issue in SQL takes it off both open lists.
		sqlExec(t, `UPDATE issue SET open = false WHERE id = 'i4'`)
		waitJS(t, tabA, "tab A", "i4 closed", title("i4")+` === null`)
		waitJS(t, tabB, "tab B", "i4 closed", title("i4")+` === null`)
	})

	t.Run("ReloadStartsFromIndexedDBAndCatchesUp", func(t *testing.T) {
		run(t, tabB, "tab B leaves", chromedp.Navigate("about:blank"))
		sqlExec(t, `UPDATE issue SET title = 'Changed while tab B was away', modified = $1 WHERE id = 'i2'`, float64(time.Now().UnixMilli()))
		run(t, tabB, "tab B comes back", chromedp.Navigate(pageURL))
		waitJS(t, tabB, "tab B", "the change made while away", hasTitle("i2", "Changed while tab B was away"))
		// A client with nothing stored connects without a baseCookie and is
		// sent everything; one that loaded its IndexedDB store connects with
		// the cookie it holds and is sent what changed since.
		cookie, err := eval(tabB, `window.jetsyncDemo.baseCookies[0] ?? null`)
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := cookie.(string); s == "" {
			t.Errorf("tab B's connection after coming back has baseCookie %v; want the cookie from its IndexedDB store", cookie)
		}
		before, err := eval(tabB, `window.jetsyncDemo.rowsBeforeFirstPoke`)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("after coming back: baseCookie %v, issue list shown before the first poke: %v", cookie, before)
	})

	t.Run("Screenshot", func(t *testing.T) {
		// The filter narrows the list; "show closed" widens it.
		run(t, tabA, "filter tab A's list", chromedp.SendKeys(chromedp.CSS(`#filter`), "tab"))
		waitJS(t, tabA, "tab A", "the filtered list", openIDs+` === 'i1,i2'`)
		waitJS(t, tabA, "tab A", "the filter cleared", `(f => { f.value = ''; f.dispatchEvent(new Event('input')); return true })(document.querySelector('#filter'))`)
		run(t, tabA, "show closed issues", chromedp.Click(chromedp.CSS(`#closed`)))
		waitJS(t, tabA, "tab A", "closed issues listed too", `document.querySelectorAll('#issues li').length === 6 && document.querySelectorAll('#issues li.closed').length === 3`)
		run(t, tabA, "select i1 in tab A", chromedp.Click(chromedp.CSS(`#issues li[data-id="i1"]`)))
		waitJS(t, tabA, "tab A", "i1 shown with its comments", `document.querySelectorAll('#comments li').length === 3`)
		png, err := chromedp.Run(tabA, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if len(png) < 8 || !strings.HasPrefix(string(png), "\x89PNG") {
			t.Fatalf("screenshot is not a PNG (%d bytes)", len(png))
		}
		// The README's copy is rewritten only when asked, so that a test
		// run leaves the checkout as it found it.
		out := filepath.Join(t.TempDir(), "demo.png")
		if *updateScreenshot {
			out = filepath.Join("..", "docs", "demo.png")
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", out)
	})
	t.Logf("browser test took %.1f s", time.Since(began).Seconds())
}

var updateScreenshot = flag.Bool("update-screenshot", false, "rewrite docs/demo.png from TestDemo_Browser")

// chromiumPath is Debian's chromium: the test skips without it, but fails
// under CI, where make deps installs it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium missing under CI (make deps installs it): %v", err)
		}
		t.Skipf("chromium not installed (make deps installs it): %v", err)
	}
	return chrome
}

// openBrowserTabs starts headless chromium and opens n tabs, each in a
// browser context of its own: they share no storage, so what one shows of
// another's edits came through the server.
func openBrowserTabs(t *testing.T, ctx context.Context, chrome string, n int) []context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome),
		chromedp.NoSandbox, // root in CI
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	var tabs []context.Context
	for range n {
		tab, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
		t.Cleanup(cancel)
		tabs = append(tabs, tab)
	}
	return tabs
}

// browserDo runs actions in a tab.
func browserDo(t *testing.T, tab context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(tab, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// browserEval is one JS expression's value in a tab.
func browserEval(tab context.Context, expr string) (any, error) {
	c, cancel := context.WithTimeout(tab, 10*time.Second)
	defer cancel()
	return chromedp.Run(c, chromedp.Evaluate[any](expr))
}

// browserWait waits until expr is true in tab.
func browserWait(t *testing.T, tab context.Context, name, what, expr string) {
	t.Helper()
	polltest.Until(t, 45*time.Second, name+": "+what, func() bool {
		v, err := browserEval(tab, expr)
		return err == nil && v == true
	})
}

// demoTitle is the JS expression of an issue's title in the page's list
// (null when the list does not show it).
func demoTitle(id string) string {
	return `(document.querySelector('#issues li[data-id="` + id + `"] .title')?.textContent ?? null)`
}

// demoOpenIDs is the JS expression of the listed issues' IDs, sorted.
const demoOpenIDs = `Array.from(document.querySelectorAll('#issues li')).map(li => li.dataset.id).sort().join(',')`
