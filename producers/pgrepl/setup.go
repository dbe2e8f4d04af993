package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsync/jetsync/streams"
)

// names are the upstream object names zero-cache uses for one shard.
type names struct {
	app, shard string // "zero", "zero_0"
	shardNum   int
}

func newNames(s streams.Shard) names { return names{app: s.App, shard: s.ID(), shardNum: s.Num} }

func (n names) defaultPublication() string {
	return fmt.Sprintf("_%s_public_%d", n.app, n.shardNum)
}

func (n names) metadataPublication() string {
	return fmt.Sprintf("_%s_metadata_%d", n.app, n.shardNum)
}

func (n names) slotPrefix() string      { return n.shard + "_" }
func (n names) ddlPrefix() string       { return fmt.Sprintf("%s/%d/ddl", n.app, n.shardNum) }
func (n names) ddlStartTrigger() string { return fmt.Sprintf("%s_ddl_start_%d", n.app, n.shardNum) }
func (n names) ddlEndTrigger() string   { return fmt.Sprintf("%s_ddl_end_%d", n.app, n.shardNum) }

// ddlLockKey serializes DDL, as zero-cache's triggers do.
const ddlLockKey = 0x3c6b8468f1bac0b0

// ConfigError reports an upstream that cannot be replicated until someone
// changes it: retrying does not help.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return "upstream: " + e.Msg }

// upstream is what setup learns about the upstream.
type upstream struct {
	systemID     string
	database     string
	publications []string // sorted, metadata publication included
	ddlDetection bool
}

// setup checks the upstream and creates zero-cache's shard objects,
// idempotently.
func setup(ctx context.Context, conn *pgx.Conn, n names, configured []string) (upstream, error) {
	var u upstream
	var walLevel string
	var version int
	err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('server_version_num')::int,
		current_database(), (SELECT system_identifier::text FROM pg_control_system())`).
		Scan(&walLevel, &version, &u.database, &u.systemID)
	if err != nil {
		return u, fmt.Errorf("check upstream: %w", err)
	}
	if walLevel != "logical" {
		return u, &ConfigError{fmt.Sprintf("Postgres must be configured with \"wal_level = logical\" (currently: %q)", walLevel)}
	}
	if version < 150000 {
		return u, &ConfigError{fmt.Sprintf("Must be running Postgres 15 or higher (currently: %d)", version)}
	}

	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, shardSQL(n))
		return err
	}); err != nil {
		return u, fmt.Errorf("create shard objects: %w", err)
	}

	pubs := slices.Clone(configured)
	if len(pubs) == 0 {
		pub := n.defaultPublication()
		if err := createPublication(ctx, conn, pub,
			"FOR TABLES IN SCHEMA public WITH (publish_via_partition_root = true)"); err != nil {
			return u, err
		}
		pubs = []string{pub}
	} else if err := validatePublications(ctx, conn, pubs); err != nil {
		return u, err
	}
	meta := n.metadataPublication()
	if err := createPublication(ctx, conn, meta, fmt.Sprintf("FOR TABLE %s.permissions, TABLE %s.clients, %s.mutations",
		ident(n.app), ident(n.shard), ident(n.shard))); err != nil {
		return u, err
	}
	pubs = append(pubs, meta)
	slices.Sort(pubs)
	pubs = slices.Compact(pubs)
	u.publications = pubs

	u.ddlDetection = true
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, ddlSQL(n))
		return err
	}); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
			return u, fmt.Errorf("create ddl triggers: %w", err)
		}
		u.ddlDetection = false
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s."shardConfig" (publications, "ddlDetection") VALUES ($1, $2)
		ON CONFLICT (lock) DO UPDATE SET publications = excluded.publications, "ddlDetection" = excluded."ddlDetection"`,
		ident(n.shard)), pubs, u.ddlDetection)
	if err != nil {
		return u, fmt.Errorf("write shardConfig: %w", err)
	}
	if u.ddlDetection {
		if err := initPublishedSchema(ctx, conn, n); err != nil {
			return u, err
		}
	}
	return u, nil
}

// specsVersion marks the shape of schema_specs(); change it with the shape.
const specsVersion = 2

// initPublishedSchema records the published schema that the next DDL event
// diffs against, when there is none yet or it has another shape: a diff
// across shapes would report changes that never happened.
func initPublishedSchema(ctx context.Context, conn *pgx.Conn, n names) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(ddlLockKey)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, strings.NewReplacer("{shard}", ident(n.shard)).Replace(`
			INSERT INTO {shard}."publishedSchema" ("current") SELECT {shard}.schema_specs()
			ON CONFLICT ("exists") DO UPDATE SET "current" = excluded."current"
			WHERE {shard}."publishedSchema"."current" IS NULL
				OR ({shard}."publishedSchema"."current"->>'version') IS DISTINCT FROM $1`), fmt.Sprint(specsVersion))
		return err
	})
	if err != nil {
		return fmt.Errorf("record published schema: %w", err)
	}
	return nil
}

func createPublication(ctx context.Context, conn *pgx.Conn, name, def string) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("check publication %s: %w", name, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+ident(name)+" "+def); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently
			return nil
		}
		return fmt.Errorf("create publication %s: %w", name, err)
	}
	return nil
}

func validatePublications(ctx context.Context, conn *pgx.Conn, pubs []string) error {
	rows, err := conn.Query(ctx, `SELECT pubname, pubinsert AND pubupdate AND pubdelete AND pubtruncate
		FROM pg_publication WHERE pubname = ANY($1) ORDER BY pubname`, pubs)
	if err != nil {
		return fmt.Errorf("read publications: %w", err)
	}
	var found []string
	var partial []string
	for rows.Next() {
		var name string
		var all bool
		if err := rows.Scan(&name, &all); err != nil {
			return fmt.Errorf("read publications: %w", err)
		}
		found = append(found, name)
		if !all {
			partial = append(partial, name)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read publications: %w", err)
	}
	if len(found) != len(slices.Compact(slices.Sorted(slices.Values(pubs)))) {
		return &ConfigError{fmt.Sprintf("Unknown or invalid publications. Specified: [%s]. Found: [%s]",
			strings.Join(pubs, ","), strings.Join(found, ","))}
	}
	if len(partial) > 0 {
		return &ConfigError{fmt.Sprintf("PUBLICATION(s) %s must publish insert, update, delete, and truncate",
			strings.Join(partial, ","))}
	}
	return nil
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// shardSQL creates the app and shard schemas and their tables.
func shardSQL(n names) string {
	r := strings.NewReplacer("{app}", ident(n.app), "{shard}", ident(n.shard))
	return r.Replace(`
CREATE SCHEMA IF NOT EXISTS {app};
CREATE TABLE IF NOT EXISTS {app}.permissions (
	"permissions" JSONB,
	"hash" TEXT,
	"lock" BOOL PRIMARY KEY DEFAULT true CHECK (lock)
);
CREATE OR REPLACE FUNCTION {app}.set_permissions_hash() RETURNS TRIGGER AS $$
BEGIN
	NEW.hash = md5(NEW.permissions::text);
	RETURN NEW;
END
$$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER on_set_permissions
	BEFORE INSERT OR UPDATE ON {app}.permissions
	FOR EACH ROW EXECUTE FUNCTION {app}.set_permissions_hash();
INSERT INTO {app}.permissions (permissions) VALUES (NULL) ON CONFLICT DO NOTHING;

CREATE SCHEMA IF NOT EXISTS {shard};
CREATE TABLE IF NOT EXISTS {shard}.clients (
	"clientGroupID" TEXT NOT NULL,
	"clientID" TEXT NOT NULL,
	"lastMutationID" BIGINT NOT NULL,
	"userID" TEXT,
	PRIMARY KEY ("clientGroupID", "clientID")
);
CREATE TABLE IF NOT EXISTS {shard}.mutations (
	"clientGroupID" TEXT NOT NULL,
	"clientID" TEXT NOT NULL,
	"mutationID" BIGINT NOT NULL,
	"result" JSON NOT NULL,
	PRIMARY KEY ("clientGroupID", "clientID", "mutationID")
);
CREATE TABLE IF NOT EXISTS {shard}."shardConfig" (
	"publications" TEXT[] NOT NULL,
	"ddlDetection" BOOL NOT NULL,
	"lock" BOOL PRIMARY KEY DEFAULT true CHECK (lock)
);
CREATE TABLE IF NOT EXISTS {shard}.replicas (
	"id" TEXT PRIMARY KEY,
	"rank" BIGSERIAL,
	"slot" TEXT NOT NULL,
	"version" TEXT NOT NULL,
	"initialSchema" JSON,
	"initialSyncContext" JSON,
	"subscriberContext" JSON
);
CREATE TABLE IF NOT EXISTS {shard}."schemaVersions" (
	"minSupportedVersion" INT4,
	"maxSupportedVersion" INT4,
	"lock" BOOL PRIMARY KEY DEFAULT true CHECK (lock)
);
INSERT INTO {shard}."schemaVersions" ("minSupportedVersion", "maxSupportedVersion") VALUES (1, 1)
	ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS {shard}."publishedSchema" (
	"current" JSON,
	"exists" BOOL PRIMARY KEY DEFAULT true CHECK ("exists")
);
`)
}

// ddlSQL installs the functions and event triggers that report DDL on
// published tables as logical messages. Events use
// protocol version 1: ddlStart carries the schema before the command,
// ddlUpdate the schema before and after.
func ddlSQL(n names) string {
	r := strings.NewReplacer(
		"{shard}", ident(n.shard),
		"{prefix}", literal(n.ddlPrefix()),
		"{start}", ident(n.ddlStartTrigger()),
		"{end}", ident(n.ddlEndTrigger()),
		"{lock}", fmt.Sprint(int64(ddlLockKey)),
		"{specsVersion}", fmt.Sprint(specsVersion),
	)
	return r.Replace(`
CREATE OR REPLACE FUNCTION {shard}.schema_specs() RETURNS JSON AS $$
	WITH pubs AS (
		SELECT unnest(publications) AS pubname FROM {shard}."shardConfig"
	), published AS (
		-- A column is published when any publication publishes it.
		SELECT c.oid, n.nspname, c.relname, c.relreplident,
			array_agg(DISTINCT a.attname) AS attnames
		FROM pg_publication_tables pt
		JOIN pubs USING (pubname)
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		CROSS JOIN unnest(pt.attnames) AS a(attname)
		GROUP BY c.oid, n.nspname, c.relname, c.relreplident
	), tables AS (
		SELECT json_agg(json_build_object(
			'oid', p.oid,
			'schema', p.nspname,
			'name', p.relname,
			'replicaIdentity', p.relreplident,
			'columns', (
				SELECT json_object_agg(a.attname, json_build_object(
					'pos', a.attnum,
					'dataType', format_type(a.atttypid, NULL),
					'typeOID', a.atttypid,
					'typmod', a.atttypmod,
					'notNull', a.attnotnull,
					'dflt', pg_get_expr(d.adbin, d.adrelid)))
				FROM pg_attribute a
				LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
				WHERE a.attrelid = p.oid AND a.attnum > 0 AND NOT a.attisdropped
					AND a.attname = ANY (p.attnames)),
			'primaryKey', (
				SELECT json_agg(a.attname ORDER BY k.ord)
				FROM pg_index i
				CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
				JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
				WHERE i.indrelid = p.oid AND i.indisprimary),
			'publications', (
				SELECT json_agg(pt.pubname ORDER BY pt.pubname)
				FROM pg_publication_tables pt JOIN pubs USING (pubname)
				WHERE pt.schemaname = p.nspname AND pt.tablename = p.relname)
		) ORDER BY p.nspname, p.relname) AS tables
		FROM published p
	), indexes AS (
		SELECT json_agg(json_build_object(
			'oid', i.indexrelid,
			'schema', p.nspname,
			'tableName', p.relname,
			'name', ic.relname,
			'unique', i.indisunique,
			'primary', i.indisprimary,
			'replicaIdentity', i.indisreplident,
			'partial', i.indpred IS NOT NULL OR i.indexprs IS NOT NULL,
			'columns', (
				SELECT json_agg(a.attname ORDER BY k.ord)
				FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
				JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum),
			'desc', (
				SELECT json_agg(k.opt & 1 = 1 ORDER BY k.ord)
				FROM unnest(i.indoption::int2[]) WITH ORDINALITY AS k(opt, ord))
		) ORDER BY p.nspname, p.relname, ic.relname) AS indexes
		FROM published p
		JOIN pg_index i ON i.indrelid = p.oid AND i.indisvalid
		JOIN pg_class ic ON ic.oid = i.indexrelid
	)
	SELECT json_build_object(
		'version', {specsVersion},
		'tables', COALESCE((SELECT tables FROM tables), '[]'::json),
		'indexes', COALESCE((SELECT indexes FROM indexes), '[]'::json))
$$ LANGUAGE SQL STABLE
-- The catalog views' row estimates are wild enough to trigger JIT, which
-- costs far more than the query.
SET jit = off;

CREATE OR REPLACE FUNCTION {shard}.get_trigger_context() RETURNS JSON AS $$
	SELECT json_build_object('query', current_query())
$$ LANGUAGE SQL STABLE;

CREATE OR REPLACE FUNCTION {shard}.update_schemas(event_type TEXT, tag TEXT, target TEXT)
RETURNS VOID AS $$
DECLARE
	prev_schema JSON;
	cur_schema JSON := {shard}.schema_specs();
BEGIN
	SELECT ps."current" INTO prev_schema FROM {shard}."publishedSchema" ps;
	IF event_type <> 'schemaSnapshot' AND prev_schema IS NOT NULL
		AND prev_schema::jsonb = cur_schema::jsonb THEN
		RETURN;
	END IF;
	INSERT INTO {shard}."publishedSchema" ("current") VALUES (cur_schema)
		ON CONFLICT ("exists") DO UPDATE SET "current" = excluded."current";
	PERFORM pg_logical_emit_message(true, {prefix}, json_build_object(
		'type', event_type,
		'version', 1,
		'event', json_build_object('tag', tag, 'target', target),
		'context', {shard}.get_trigger_context(),
		'previousSchema', prev_schema,
		'schema', cur_schema)::text);
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION {shard}.update_schemas() RETURNS VOID AS $$
	SELECT {shard}.update_schemas('schemaSnapshot', 'MANUAL', NULL)
$$ LANGUAGE SQL;

CREATE OR REPLACE FUNCTION {shard}.notice_ignore(reason TEXT, tag TEXT, target TEXT) RETURNS VOID AS $$
BEGIN
	RAISE NOTICE 'zero(%) ignoring % %: %', {prefix}, tag, COALESCE(target, ''), reason;
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION {shard}.emit_ddl_start() RETURNS event_trigger AS $$
BEGIN
	PERFORM pg_advisory_xact_lock({lock});
	PERFORM pg_logical_emit_message(true, {prefix}, json_build_object(
		'type', 'ddlStart',
		'version', 1,
		'event', json_build_object('tag', TG_TAG),
		'context', {shard}.get_trigger_context(),
		'schema', {shard}.schema_specs(),
		'previousSchema', NULL)::text);
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION {shard}.emit_ddl_end() RETURNS event_trigger AS $$
DECLARE
	target TEXT;
	on_publication BOOL;
BEGIN
	SELECT string_agg(object_identity, ','), bool_or(object_type = 'publication')
	INTO target, on_publication
	FROM pg_event_trigger_ddl_commands();
	IF TG_TAG = 'COMMENT' AND NOT COALESCE(on_publication, false) THEN
		PERFORM {shard}.notice_ignore('not a publication', TG_TAG, target);
		RETURN;
	END IF;
	-- COMMENT ON PUBLICATION is a manual hook (for providers whose event
	-- triggers miss ALTER PUBLICATION): it always reports the schema.
	PERFORM {shard}.update_schemas(
		CASE WHEN TG_TAG = 'COMMENT' THEN 'schemaSnapshot' ELSE 'ddlUpdate' END, TG_TAG, target);
END
$$ LANGUAGE plpgsql;

DROP EVENT TRIGGER IF EXISTS {start};
CREATE EVENT TRIGGER {start} ON ddl_command_start
	WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE INDEX', 'DROP TABLE', 'DROP INDEX',
		'ALTER PUBLICATION', 'ALTER SCHEMA')
	EXECUTE PROCEDURE {shard}.emit_ddl_start();
DROP EVENT TRIGGER IF EXISTS {end};
CREATE EVENT TRIGGER {end} ON ddl_command_end
	WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE INDEX', 'DROP TABLE', 'DROP INDEX',
		'ALTER PUBLICATION', 'ALTER SCHEMA', 'COMMENT')
	EXECUTE PROCEDURE {shard}.emit_ddl_end();
`)
}
