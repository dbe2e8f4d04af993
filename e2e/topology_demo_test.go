package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestTopology_DemoPage runs docker-compose.yml's topology with the demo app
// loaded as compose loads it (cmd/jetsync/demo.sql and the demo
// permissions) and opens the demo page through the proxy in two chromium
// tabs: the view-syncers serve it at /demo, an edit in one tab goes through
// a view-syncer to demo-api and shows in the other, and an SQL update shows
// in both.
func TestTopology_DemoPage(t *testing.T) {
	chrome := chromiumPath(t)
	demoSQL, err := os.ReadFile(filepath.Join("..", "cmd", "jetsync", "demo.sql"))
	if err != nil {
		t.Fatal(err)
	}
	tp, pg, _ := newTopologyRig(t, string(demoSQL)+readCompose(t).Configs["demo-permissions"].Content)
	tp.start(topologyAll...)
	page := tp.url("proxy", 4848) + "/demo"

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tabs := openBrowserTabs(t, ctx, chrome, 2)
	for i, tab := range tabs {
		name := "tab " + strconv.Itoa(i+1)
		browserDo(t, tab, "open "+name, chromedp.Navigate(page))
		browserWait(t, tab, name, "connected, with the demo's open issues",
			`window.jetsyncDemo?.connection === 'connected' && `+demoOpenIDs+` === 'i1,i2,i4'`)
	}
	hasTitle := func(id, want string) string { return demoTitle(id) + ` === ` + strconv.Quote(want) }

	browserDo(t, tabs[0], "select i1", chromedp.Click(chromedp.CSS(`#issues li[data-id="i1"]`)))
	browserWait(t, tabs[0], "tab 1", "i1 selected", `document.querySelector('#edit-title').value === 'Replica lags after a large COPY'`)
	browserDo(t, tabs[0], "edit i1",
		chromedp.SetValue(chromedp.CSS(`#edit-title`), "Edited on the cluster"),
		chromedp.Click(chromedp.CSS(`#save-title`)))
	browserWait(t, tabs[1], "tab 2", "tab 1's edit", hasTitle("i1", "Edited on the cluster"))
	var title string
	if err := pg.QueryRow(ctx, `SELECT title FROM issue WHERE id = 'i1'`).Scan(&title); err != nil || title != "Edited on the cluster" {
		t.Errorf("Postgres i1 title = %q, %v; want demo-api's write", title, err)
	}

	if _, err := pg.Exec(ctx, `UPDATE issue SET title = 'Updated by SQL' WHERE id = 'i2'`); err != nil {
		t.Fatal(err)
	}
	for i, tab := range tabs {
		browserWait(t, tab, "tab "+strconv.Itoa(i+1), "the SQL update", hasTitle("i2", "Updated by SQL"))
	}
}
