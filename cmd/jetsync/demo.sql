-- The demo upstream of `jetsync run` without ZERO_UPSTREAM_DB: the benchmark
-- app's tables (testdata/bench/schema.sql) with a few rows. Loaded once, into
-- a fresh database; edit it freely with psql afterwards.

CREATE TABLE "user" (
  id   text PRIMARY KEY,
  name text NOT NULL
);

CREATE TABLE issue (
  id       text PRIMARY KEY,
  title    text NOT NULL,
  open     boolean NOT NULL,
  modified double precision NOT NULL,
  owner_id text REFERENCES "user"(id),
  created  timestamptz NOT NULL
);
CREATE INDEX issue_modified_idx ON issue (modified);
CREATE INDEX issue_owner_idx    ON issue (owner_id);

CREATE TABLE comment (
  id       text PRIMARY KEY,
  issue_id text NOT NULL,
  body     text NOT NULL,
  created  timestamptz NOT NULL
);
CREATE INDEX comment_issue_idx ON comment (issue_id);

CREATE TABLE label (
  id   text PRIMARY KEY,
  name text NOT NULL
);

CREATE TABLE issue_label (
  issue_id text NOT NULL,
  label_id text NOT NULL,
  PRIMARY KEY (issue_id, label_id)
);
CREATE INDEX issue_label_label_idx ON issue_label (label_id);

INSERT INTO "user" (id, name) VALUES
  ('u1', 'Ada'),
  ('u2', 'Grace'),
  ('u3', 'Linus');

INSERT INTO label (id, name) VALUES
  ('l1', 'bug'),
  ('l2', 'feature'),
  ('l3', 'docs');

INSERT INTO issue (id, title, open, modified, owner_id, created) VALUES
  ('i1', 'Replica lags after a large COPY', true,  1700000000000, 'u1', '2024-01-02 10:00:00+00'),
  ('i2', 'Document the change stream',      true,  1700000100000, 'u2', '2024-01-03 11:30:00+00'),
  ('i3', 'Support enum columns',            false, 1700000200000, 'u3', '2024-01-04 09:15:00+00'),
  ('i4', 'Unicode titles: ünïcødé ✓',       true,  1700000300000, NULL, '2024-01-05 16:45:00+00');

INSERT INTO comment (id, issue_id, body, created) VALUES
  ('c1', 'i1', 'Seen on a 1M-row table.',            '2024-01-02 10:05:00+00'),
  ('c2', 'i1', 'Fixed by batching the backfill.',    '2024-01-02 12:00:00+00'),
  ('c3', 'i2', 'See streams/README.md.',             '2024-01-03 12:00:00+00'),
  ('c4', 'i4', 'Round-trips through SQLite intact.', '2024-01-05 17:00:00+00');

INSERT INTO issue_label (issue_id, label_id) VALUES
  ('i1', 'l1'),
  ('i2', 'l3'),
  ('i3', 'l2'),
  ('i4', 'l1'),
  ('i4', 'l3');
