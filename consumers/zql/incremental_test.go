package zql

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

type incrementalRecord struct {
	ID      string                      `json:"id"`
	ZQL     string                      `json:"zql"`
	AST     json.RawMessage             `json:"ast"`
	SQL     string                      `json:"sql"`
	Before  map[string][]map[string]any `json:"before"`
	Changes struct {
		Puts map[string][]map[string]any `json:"puts"`
		Dels map[string][]map[string]any `json:"dels"`
	} `json:"changes"`
	WitnessesVary bool `json:"witnessesVary"`
}

// TestHydrate_IncrementalCorpus checks hydration before and after each
// scenario's transaction of incremental.jsonl: the corpus README promises
// that before + changes is what a fresh hydration after it syncs. This
// covers NULLs, which the base dataset lacks.
func TestHydrate_IncrementalCorpus(t *testing.T) {
	recs := loadIncremental(t)
	db := seedReplica(t, 1000, 2, true)
	ctx := context.Background()
	for _, rec := range recs {
		t.Run(rec.ID, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := checkRecord(t, tx, hydrateRecord{ID: rec.ID, AST: rec.AST, Rows: rec.Before}); err != nil {
				t.Fatalf("before: %v\n  zql: %s", err, rec.ZQL)
			}
			if err := execScenario(ctx, tx, rec.SQL); err != nil {
				t.Fatal(err)
			}
			after := applyChanges(rec)
			err = checkRecord(t, tx, hydrateRecord{ID: rec.ID, AST: rec.AST, Rows: after, versionless: true})
			if err != nil {
				t.Errorf("after %s: %v\n  zql: %s", rec.SQL, err, rec.ZQL)
			}
		})
	}
}

// applyChanges returns before with the scenario's puts and dels applied.
func applyChanges(rec incrementalRecord) map[string][]map[string]any {
	byKey := map[string]map[string]map[string]any{}
	set := func(table string, row map[string]any) {
		if byKey[table] == nil {
			byKey[table] = map[string]map[string]any{}
		}
		byKey[table][pkString(table, row)] = row
	}
	for table, rows := range rec.Before {
		for _, r := range rows {
			set(table, r)
		}
	}
	for table, rows := range rec.Changes.Puts {
		for _, r := range rows {
			set(table, r)
		}
	}
	for table, pks := range rec.Changes.Dels {
		for _, pk := range pks {
			delete(byKey[table], pkString(table, pk))
		}
	}
	out := map[string][]map[string]any{}
	for table, rows := range byKey {
		for _, r := range rows {
			out[table] = append(out[table], r)
		}
	}
	return out
}

var timestamptzLit = regexp.MustCompile(`timestamptz '([^']*)'`)

// execScenario runs a scenario's Postgres statements on the SQLite replica,
// translated where the dialects differ.
func execScenario(ctx context.Context, tx *sql.Tx, script string) error {
	for _, stmt := range strings.Split(script, ";\n") {
		stmt = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(stmt), ";"))
		switch {
		case stmt == "":
			continue
		case strings.HasPrefix(stmt, "SET LOCAL"):
			continue // foreign keys: the replica has none
		case strings.HasPrefix(stmt, "TRUNCATE "):
			stmt = "DELETE FROM " + strings.TrimPrefix(stmt, "TRUNCATE ")
		}
		var convErr error
		stmt = timestamptzLit.ReplaceAllStringFunc(stmt, func(m string) string {
			ts, err := time.Parse("2006-01-02 15:04:05-07", timestamptzLit.FindStringSubmatch(m)[1])
			if err != nil {
				convErr = err
			}
			return strconv.FormatInt(ts.UnixMilli(), 10)
		})
		if convErr != nil {
			return fmt.Errorf("%s: %w", stmt, convErr)
		}
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

func loadIncremental(t *testing.T) []incrementalRecord {
	t.Helper()
	f, err := os.Open(corpusDir + "/incremental.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []incrementalRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var r incrementalRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}
