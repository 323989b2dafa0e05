-- The fill-job service's schema (docs/service.md). Applied by the service's owner role
-- (`pipefill init`). Every statement is idempotent, and it upgrades a database made by an
-- earlier release in place (columns, tables and indexes added, functions replaced, the old
-- functions' signatures dropped), all in one transaction. Leases granted before an upgrade carry
-- no secret, so they can no longer be renewed or committed: their shards are re-claimed after
-- their TTL (docs/service.md, Upgrading).
--
-- Roles: pf_submitter (members create, read and cancel their own jobs: row-level security on
-- owner = session_user), pf_rank (members hold no table privilege at all: they can only call the
-- SECURITY DEFINER functions pf_advertise / pf_claim / pf_renew / pf_commit / pf_release /
-- pf_fail / pf_manifest). A lease is the triple (token, secret, login): pf_claim returns a
-- random 256-bit secret to the claiming session only and stores its sha256; every later call on
-- the lease must come from the same login with the token and the secret, before the lease
-- expires. A rank name belongs to the login that first used it. The owner (whoever runs this
-- script) manages the allowlist.
--
-- Claims cost the same whatever the queue's length: the running jobs are walked in priority
-- order (index jobs_running) and fit-filtered per job, then each job's pending shards are taken
-- in shard order from the partial index shards_pending_by_job (LIMIT before anything else, SKIP
-- LOCKED); expired leases are put back to pending by a sweep that runs at most every 250 ms.
-- docs/service.md shows the plans (EXPLAIN ANALYZE at 10^6 shards).

DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pf_submitter') THEN
    CREATE ROLE pf_submitter NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pf_rank') THEN
    CREATE ROLE pf_rank NOLOGIN;
  END IF;
END $$;

CREATE SCHEMA IF NOT EXISTS pipefill;
REVOKE ALL ON SCHEMA pipefill FROM PUBLIC;
GRANT USAGE ON SCHEMA pipefill TO pf_submitter, pf_rank;

-- Code a job may name: an entry point of an installed distribution with this exact version and
-- sha256 (of the distribution's RECORD file, whose lines carry every file's hash).
CREATE TABLE IF NOT EXISTS pipefill.allowlist (
  dist_name   text NOT NULL,
  dist_version text NOT NULL,
  sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  added_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (dist_name, dist_version, sha256)
);

CREATE SEQUENCE IF NOT EXISTS pipefill.fencing_token;

CREATE TABLE IF NOT EXISTS pipefill.jobs (
  id            bigserial PRIMARY KEY,
  name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  owner         name NOT NULL DEFAULT session_user,
  dist_name     text NOT NULL,
  dist_version  text NOT NULL,
  dist_sha256   text NOT NULL,
  entry_point   text NOT NULL CHECK (length(entry_point) BETWEEN 1 AND 200),
  params        jsonb NOT NULL DEFAULT '{}',
  dataset       text NOT NULL,
  item_count    bigint NOT NULL CHECK (item_count > 0),
  shard_items   bigint NOT NULL CHECK (shard_items > 0),
  output_dir    text NOT NULL CHECK (output_dir LIKE '/%'),
  memory_bytes  bigint NOT NULL DEFAULT 0 CHECK (memory_bytes >= 0),
  item_cost_us  double precision NOT NULL DEFAULT 0 CHECK (item_cost_us >= 0),
  priority      integer NOT NULL DEFAULT 0,
  deadline      timestamptz,
  lease_ttl_s   double precision NOT NULL DEFAULT 30 CHECK (lease_ttl_s > 0),
  max_failures  integer NOT NULL DEFAULT 3 CHECK (max_failures > 0),
  state         text NOT NULL DEFAULT 'running'
                CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
  message       text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  finished_at   timestamptz
);
-- Failures of the job's code so far (pf_fail compares it with max_failures without summing the
-- job's shards). Added by this release: an older database gets it backfilled from its shards.
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'pipefill'
                 AND table_name = 'jobs' AND column_name = 'failures') THEN
    ALTER TABLE pipefill.jobs ADD COLUMN failures integer NOT NULL DEFAULT 0;
    IF to_regclass('pipefill.shards') IS NOT NULL THEN
      UPDATE pipefill.jobs j SET failures = f.total
        FROM (SELECT job_id, sum(failures)::integer AS total FROM pipefill.shards
              GROUP BY job_id) f WHERE f.job_id = j.id AND f.total > 0;
    END IF;
  END IF;
END $$;
-- The limits docs/service.md lists (the submit side checks them first, naming the field); here
-- they also hold for a submitter inserting rows directly. NOT VALID: rows of an older release
-- are not re-checked. A lease_ttl_s beyond a week, say, would make every claim's interval
-- arithmetic fail while the job is first in line.
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'jobs_limits_v1'
                 AND conrelid = 'pipefill.jobs'::regclass) THEN
    ALTER TABLE pipefill.jobs ADD CONSTRAINT jobs_limits_v1 CHECK (
      length(dist_name) BETWEEN 1 AND 200 AND length(dist_version) BETWEEN 1 AND 200
      AND dist_sha256 ~ '^[0-9a-f]{64}$' AND length(dataset) BETWEEN 1 AND 4096
      AND octet_length(output_dir) <= 1024 AND jsonb_typeof(params) = 'object'
      AND octet_length(params::text) <= 1048576 AND item_cost_us <= 1e9
      AND lease_ttl_s BETWEEN 0.1 AND 604800 AND max_failures <= 1000000) NOT VALID;
  END IF;
END $$;
-- Claims walk the running jobs in this order (and stop at the first that fills the claim).
CREATE INDEX IF NOT EXISTS jobs_running ON pipefill.jobs
  (priority DESC, deadline ASC NULLS LAST, id) WHERE state = 'running';

CREATE TABLE IF NOT EXISTS pipefill.shards (
  job_id          bigint NOT NULL REFERENCES pipefill.jobs(id),
  shard           integer NOT NULL,
  item_start      bigint NOT NULL,
  item_end        bigint NOT NULL,
  state           text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'leased', 'committed', 'failed', 'cancelled')),
  lease_token     bigint,
  lease_rank      text,
  lease_expires   timestamptz,
  checkpoint      jsonb,
  attempts        integer NOT NULL DEFAULT 0,
  expirations     integer NOT NULL DEFAULT 0,
  preemptions     integer NOT NULL DEFAULT 0,
  failures        integer NOT NULL DEFAULT 0,
  committed_token bigint,
  output_path     text,
  output_sha256   text,
  output_bytes    bigint,
  committed_at    timestamptz,
  PRIMARY KEY (job_id, shard)
);
-- The lease's holder: its login and the sha256 of its secret (the secret itself is only ever
-- returned to the claiming session).
ALTER TABLE pipefill.shards ADD COLUMN IF NOT EXISTS lease_login name;
ALTER TABLE pipefill.shards ADD COLUMN IF NOT EXISTS lease_secret_sha256 bytea;
-- An earlier release's index over pending and leased shards together: a claim had to sort all
-- of them. Replaced by one index per use.
DROP INDEX IF EXISTS pipefill.shards_claimable;
-- Claims: a job's pending shards in shard order. The key is an expression (the job id while
-- pending, else NULL) that only this index serves: with a plain (job_id, shard) key the
-- planner, seeing most rows pending, may as well walk the primary key and filter out every
-- committed shard at the job's head (a claim's cost would grow with the shards done). Queries
-- name the same expression and ORDER BY shard LIMIT, so no other plan competes.
CREATE INDEX IF NOT EXISTS shards_pending_by_job ON pipefill.shards
  ((CASE WHEN state = 'pending' THEN job_id END), shard) WHERE state = 'pending';
-- The expiry sweep and the "is anything of this job still leased" check at its last commits.
CREATE INDEX IF NOT EXISTS shards_leased_by_job ON pipefill.shards
  ((CASE WHEN state = 'leased' THEN job_id END)) WHERE state = 'leased';
-- A queue's shards change state at the head of these partial indexes; the dead entries claims
-- step over until VACUUM removes them grow with the claims since the last vacuum, so vacuum
-- this table after a fixed number of changes instead of a fifth of the table.
ALTER TABLE pipefill.shards SET (autovacuum_vacuum_scale_factor = 0.0,
  autovacuum_vacuum_threshold = 20000, autovacuum_vacuum_insert_scale_factor = 0.0,
  autovacuum_vacuum_insert_threshold = 100000);

-- One row per lease ever granted: who ran what with which token and how it ended.
CREATE TABLE IF NOT EXISTS pipefill.attempts (
  token        bigint PRIMARY KEY,
  job_id       bigint NOT NULL,
  shard        integer NOT NULL,
  rank         text NOT NULL,
  resumed_from bigint NOT NULL DEFAULT 0,
  outcome      text NOT NULL DEFAULT 'running'
               CHECK (outcome IN ('running', 'committed', 'fenced', 'preempted', 'failed',
                                  'cancelled')),
  message      text,
  output_path  text,
  started_at   timestamptz NOT NULL DEFAULT now(),
  ended_at     timestamptz
);
ALTER TABLE pipefill.attempts ADD COLUMN IF NOT EXISTS login name;
ALTER TABLE pipefill.attempts ADD COLUMN IF NOT EXISTS secret_sha256 bytea;
CREATE INDEX IF NOT EXISTS attempts_by_shard ON pipefill.attempts (job_id, shard);

-- Each rank's advertised capacity (what its bubbles can take): per bubble class its p10
-- duration and count per iteration (`classes`, a JSON array of {"key", "p10_us",
-- "per_iteration"}), the arena bytes a new job can get (free_bytes) and the device's memory,
-- measured by the rank's runtime. bubble_p10_us / bubbles_per_iteration summarise the classes
-- (the longest class p10, the sum of the counts) for dashboards.
CREATE TABLE IF NOT EXISTS pipefill.ranks (
  rank          text PRIMARY KEY,
  free_bytes    bigint NOT NULL,
  bubble_p10_us double precision NOT NULL,
  bubbles_per_iteration double precision NOT NULL,
  iterations_per_s double precision NOT NULL,
  seen_at       timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE pipefill.ranks ADD COLUMN IF NOT EXISTS classes jsonb NOT NULL DEFAULT '[]';
ALTER TABLE pipefill.ranks ADD COLUMN IF NOT EXISTS arena_bytes bigint;
ALTER TABLE pipefill.ranks ADD COLUMN IF NOT EXISTS device_free_bytes bigint;
ALTER TABLE pipefill.ranks ADD COLUMN IF NOT EXISTS device_total_bytes bigint;
ALTER TABLE pipefill.ranks ADD COLUMN IF NOT EXISTS login name;

-- Rank names and the login each belongs to: the first login that advertises or claims with a
-- name owns it; any other login using it is refused (the owner may delete a row to free it).
CREATE TABLE IF NOT EXISTS pipefill.rank_logins (
  rank          text PRIMARY KEY CHECK (length(rank) BETWEEN 1 AND 200),
  login         name NOT NULL,
  registered_at timestamptz NOT NULL DEFAULT now()
);
-- Names a database of an earlier release already knows: bound to nobody yet (the first login
-- to use one gets it).

-- When the expiry sweep last ran (one row).
CREATE TABLE IF NOT EXISTS pipefill.sweeps (
  id       integer PRIMARY KEY CHECK (id = 1),
  swept_at timestamptz NOT NULL
);
INSERT INTO pipefill.sweeps VALUES (1, '-infinity') ON CONFLICT DO NOTHING;

-- Submitters: their own jobs only.
ALTER TABLE pipefill.jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE pipefill.shards ENABLE ROW LEVEL SECURITY;
ALTER TABLE pipefill.attempts ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS own_jobs ON pipefill.jobs;
CREATE POLICY own_jobs ON pipefill.jobs USING (owner = session_user)
  WITH CHECK (owner = session_user);
DROP POLICY IF EXISTS own_shards ON pipefill.shards;
CREATE POLICY own_shards ON pipefill.shards USING (
  EXISTS (SELECT 1 FROM pipefill.jobs j WHERE j.id = job_id AND j.owner = session_user));
DROP POLICY IF EXISTS own_attempts ON pipefill.attempts;
CREATE POLICY own_attempts ON pipefill.attempts USING (
  EXISTS (SELECT 1 FROM pipefill.jobs j WHERE j.id = job_id AND j.owner = session_user));

REVOKE ALL ON ALL TABLES IN SCHEMA pipefill FROM PUBLIC, pf_submitter, pf_rank;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pipefill FROM PUBLIC, pf_submitter, pf_rank;
GRANT SELECT ON pipefill.jobs, pipefill.shards, pipefill.attempts, pipefill.ranks,
  pipefill.allowlist TO pf_submitter;
GRANT INSERT (name, dist_name, dist_version, dist_sha256, entry_point, params, dataset,
              item_count, shard_items, output_dir, memory_bytes, item_cost_us, priority,
              deadline, lease_ttl_s, max_failures) ON pipefill.jobs TO pf_submitter;
GRANT USAGE ON SEQUENCE pipefill.jobs_id_seq TO pf_submitter;

-- A new job: refused unless its code is allowlisted; split into shards of shard_items items.
CREATE OR REPLACE FUNCTION pipefill.job_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM allowlist a WHERE a.dist_name = NEW.dist_name
                 AND a.dist_version = NEW.dist_version AND a.sha256 = NEW.dist_sha256) THEN
    RAISE EXCEPTION 'job code (%, %, %) is not allowlisted', NEW.dist_name, NEW.dist_version,
      NEW.dist_sha256 USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF (NEW.item_count - 1) / NEW.shard_items + 1 > 10000000 THEN
    RAISE EXCEPTION 'job % would have % shards (more than 10000000): raise shard_items',
      NEW.name, (NEW.item_count - 1) / NEW.shard_items + 1;
  END IF;
  INSERT INTO shards (job_id, shard, item_start, item_end)
  SELECT NEW.id, s::integer, s * NEW.shard_items, least((s + 1) * NEW.shard_items, NEW.item_count)
  FROM generate_series(0, (NEW.item_count - 1) / NEW.shard_items) AS s;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS job_inserted ON pipefill.jobs;
CREATE TRIGGER job_inserted AFTER INSERT ON pipefill.jobs
  FOR EACH ROW EXECUTE FUNCTION pipefill.job_inserted();

-- Cancel: only the job's owner, only a running job; its open leases are fenced by the state.
-- Lock order as every other writer (a shard, then its job's row: pf_commit completing the job,
-- pf_fail counting a failure), so a cancel never deadlocks with them; a job that finished
-- meanwhile is not cancelled and nothing is changed (the subtransaction is rolled back).
CREATE OR REPLACE FUNCTION pipefill.pf_cancel(p_job bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM jobs WHERE id = p_job AND owner = session_user
                 AND state = 'running') THEN
    RETURN false;
  END IF;
  BEGIN
    UPDATE shards SET state = 'cancelled' WHERE job_id = p_job AND state IN ('pending', 'leased');
    UPDATE jobs SET state = 'cancelled', finished_at = now(),
           message = 'cancelled by ' || session_user
     WHERE id = p_job AND owner = session_user AND state = 'running';
    IF NOT FOUND THEN
      RAISE EXCEPTION 'job % finished meanwhile', p_job USING ERRCODE = 'no_data_found';
    END IF;
  EXCEPTION WHEN no_data_found THEN
    RETURN false;
  END;
  RETURN true;
END $$;

-- The capacity classes a rank sends: a JSON array of objects with a finite p10_us >= 0 and
-- per_iteration >= 0 (anything else is refused, naming the value).
CREATE OR REPLACE FUNCTION pipefill.check_classes(p_classes jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pipefill, pg_temp AS $$
DECLARE
  c jsonb;
BEGIN
  IF p_classes IS NULL OR jsonb_typeof(p_classes) <> 'array' THEN
    RAISE EXCEPTION 'capacity classes must be a JSON array of {"key", "p10_us", '
      '"per_iteration"}, got %', left(coalesce(p_classes::text, 'NULL'), 200);
  END IF;
  IF jsonb_array_length(p_classes) > 1000 THEN
    RAISE EXCEPTION 'capacity classes: % classes (at most 1000)', jsonb_array_length(p_classes);
  END IF;
  FOR c IN SELECT * FROM jsonb_array_elements(p_classes) LOOP
    IF jsonb_typeof(c) <> 'object' OR jsonb_typeof(c -> 'p10_us') <> 'number'
       OR jsonb_typeof(c -> 'per_iteration') <> 'number'
       OR (c ->> 'p10_us')::double precision < 0
       OR (c ->> 'per_iteration')::double precision < 0 THEN
      RAISE EXCEPTION 'capacity class % needs numbers p10_us >= 0 and per_iteration >= 0',
        left(c::text, 200);
    END IF;
  END LOOP;
END $$;

-- Whether job p_job has a pending (leased) shard: one probe of shards_pending_by_job
-- (shards_leased_by_job), never a scan of the job's shards.
CREATE OR REPLACE FUNCTION pipefill.has_pending(p_job bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pipefill, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM (
    SELECT s.shard FROM shards s
     WHERE (CASE WHEN s.state = 'pending' THEN s.job_id END) = p_job AND s.state = 'pending'
     ORDER BY s.shard LIMIT 1) AS first);
$$;
CREATE OR REPLACE FUNCTION pipefill.has_leased(p_job bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pipefill, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM (
    SELECT 1 FROM shards s
     WHERE (CASE WHEN s.state = 'leased' THEN s.job_id END) = p_job AND s.state = 'leased'
     ORDER BY (CASE WHEN s.state = 'leased' THEN s.job_id END) LIMIT 1) AS first);
$$;

-- The sha256 of a lease secret given as 64 hex digits (NULL for anything else: matches nothing).
CREATE OR REPLACE FUNCTION pipefill.secret_sha256(p_secret text) RETURNS bytea
LANGUAGE sql IMMUTABLE SET search_path = pipefill, pg_temp AS $$
  SELECT CASE WHEN p_secret ~ '^[0-9a-f]{64}$' THEN sha256(decode(p_secret, 'hex')) END;
$$;

-- The calling login's claim on a rank name: the first login to use a name owns it.
CREATE OR REPLACE FUNCTION pipefill.bind_rank(p_rank text) RETURNS void
LANGUAGE plpgsql SET search_path = pipefill, pg_temp AS $$
DECLARE
  v_login name;
BEGIN
  IF p_rank IS NULL OR length(p_rank) NOT BETWEEN 1 AND 200 THEN
    RAISE EXCEPTION 'rank name % must be 1..200 characters', left(quote_nullable(p_rank), 60)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT login INTO v_login FROM rank_logins WHERE rank = p_rank;
  IF NOT FOUND THEN
    INSERT INTO rank_logins (rank, login) VALUES (p_rank, session_user) ON CONFLICT DO NOTHING;
    SELECT login INTO v_login FROM rank_logins WHERE rank = p_rank;
  END IF;
  IF v_login <> session_user THEN
    RAISE EXCEPTION 'rank name % is registered by another login than %', quote_literal(p_rank),
      session_user USING ERRCODE = 'insufficient_privilege';
  END IF;
END $$;

DROP FUNCTION IF EXISTS pipefill.pf_advertise(text, bigint, double precision, double precision,
  double precision);
CREATE OR REPLACE FUNCTION pipefill.pf_advertise(p_rank text, p_free_bytes bigint,
    p_classes jsonb, p_iterations_per_s double precision, p_arena_bytes bigint,
    p_device_free_bytes bigint, p_device_total_bytes bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  PERFORM check_classes(p_classes);
  PERFORM bind_rank(p_rank);
  INSERT INTO ranks (rank, free_bytes, bubble_p10_us, bubbles_per_iteration, iterations_per_s,
                     seen_at, classes, arena_bytes, device_free_bytes, device_total_bytes, login)
  SELECT p_rank, p_free_bytes,
         coalesce(max((c ->> 'p10_us')::double precision), 0),
         coalesce(sum((c ->> 'per_iteration')::double precision), 0),
         p_iterations_per_s, now(), p_classes, p_arena_bytes, p_device_free_bytes,
         p_device_total_bytes, session_user
    FROM jsonb_array_elements(p_classes) AS c
  ON CONFLICT (rank) DO UPDATE SET free_bytes = EXCLUDED.free_bytes,
    bubble_p10_us = EXCLUDED.bubble_p10_us,
    bubbles_per_iteration = EXCLUDED.bubbles_per_iteration,
    iterations_per_s = EXCLUDED.iterations_per_s, seen_at = now(), classes = EXCLUDED.classes,
    arena_bytes = EXCLUDED.arena_bytes, device_free_bytes = EXCLUDED.device_free_bytes,
    device_total_bytes = EXCLUDED.device_total_bytes, login = EXCLUDED.login;
END $$;

-- At most every 250 ms (the first claimer to find the sweep due runs it; the others skip the
-- locked row): expired leases go back to pending (their holders are fenced: renew and commit
-- check the expiry), and running jobs with nothing pending or leased left are completed (two
-- last commits that ran at the same time each saw the other's shard still leased). Returns
-- the jobs it completed: the claimer exports their manifests.
CREATE OR REPLACE FUNCTION pipefill.sweep() RETURNS TABLE (job_id bigint)
LANGUAGE plpgsql SET search_path = pipefill, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_job bigint;
BEGIN
  PERFORM 1 FROM sweeps WHERE id = 1 AND swept_at <= clock_timestamp() - interval '250 ms'
    FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  UPDATE sweeps SET swept_at = clock_timestamp() WHERE id = 1;
  WITH expired AS (
    SELECT s.job_id, s.shard FROM shards s
     WHERE s.state = 'leased' AND s.lease_expires < now()
     ORDER BY (CASE WHEN s.state = 'leased' THEN s.job_id END)  -- the leased shards only
     LIMIT 10000 FOR UPDATE SKIP LOCKED),
  requeued AS (
    UPDATE shards s SET state = 'pending', expirations = s.expirations + 1,
           lease_expires = NULL, lease_secret_sha256 = NULL
      FROM expired e WHERE s.job_id = e.job_id AND s.shard = e.shard
    RETURNING s.lease_token)
  UPDATE attempts a SET outcome = 'fenced', ended_at = now(),
         message = 'lease expired (not renewed within lease_ttl_s)'
    FROM requeued r WHERE a.token = r.lease_token AND a.outcome = 'running';
  -- Per running job two index probes (a NOT EXISTS join could be planned as a scan of every
  -- pending shard).
  FOR v_job IN SELECT j.id FROM jobs j WHERE j.state = 'running' LOOP
    CONTINUE WHEN has_pending(v_job) OR has_leased(v_job);
    UPDATE jobs j SET state = 'completed', finished_at = now()
     WHERE j.id = (SELECT id FROM jobs WHERE id = v_job AND state = 'running'
                   FOR UPDATE SKIP LOCKED)
       AND j.state = 'running';
    IF FOUND THEN
      job_id := v_job;
      RETURN NEXT;
    END IF;
  END LOOP;
END $$;

-- Claim up to p_limit shards that fit (memory, and one item within the p10 duration of one of
-- the rank's bubble classes that occurs every iteration or so) from running, allowlisted jobs,
-- in the order priority, deadline, job, shard. The fit is decided per job: a job that does not
-- fit costs one row of jobs, never a scan of its shards. Each job's pending shards come from
-- the index shards_pending_by_job in order (LIMIT, then SKIP LOCKED: concurrent claimers never
-- wait on each other's rows), so a claim costs the same with 10^3 or 10^6 shards queued.
-- Each lease gets a new fencing token and a random 256-bit secret (two gen_random_uuid(), 244
-- random bits), returned here only; the shard stores its sha256 and the claiming login.
-- Rows with shard = -1 (no lease) name jobs the sweep completed: the caller exports their
-- manifest.
DROP FUNCTION IF EXISTS pipefill.pf_claim(text, bigint, double precision, integer);
DO $$ BEGIN
  -- The earlier release's pf_claim returned no secret (a different result type).
  IF to_regprocedure('pipefill.pf_claim(text, bigint, jsonb, integer)') IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM pg_proc WHERE oid =
                     to_regprocedure('pipefill.pf_claim(text, bigint, jsonb, integer)')
                     AND 'secret' = ANY (proargnames)) THEN
    DROP FUNCTION pipefill.pf_claim(text, bigint, jsonb, integer);
  END IF;
END $$;
CREATE OR REPLACE FUNCTION pipefill.pf_claim(p_rank text, p_free_bytes bigint,
    p_classes jsonb, p_limit integer)
RETURNS TABLE (job_id bigint, shard integer, token bigint, secret text, item_start bigint,
               item_end bigint, checkpoint jsonb, lease_ttl_s double precision,
               dist_name text, dist_version text, dist_sha256 text, entry_point text,
               params jsonb, dataset text, output_dir text, item_count bigint,
               item_cost_us double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_longest double precision;
  v_left integer := p_limit;
  v_got integer;
  v_job record;
BEGIN
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
    RAISE EXCEPTION 'claim limit % is outside [1, 1000]', p_limit;
  END IF;
  PERFORM check_classes(p_classes);
  PERFORM bind_rank(p_rank);
  RETURN QUERY
  SELECT j.id, -1, 0::bigint, NULL::text, 0::bigint, 0::bigint, NULL::jsonb, j.lease_ttl_s,
         j.dist_name, j.dist_version, j.dist_sha256, j.entry_point, j.params, j.dataset,
         j.output_dir, j.item_count, j.item_cost_us
    FROM sweep() w JOIN jobs j ON j.id = w.job_id;
  SELECT max((c ->> 'p10_us')::double precision) INTO v_longest
    FROM jsonb_array_elements(p_classes) AS c
   WHERE (c ->> 'per_iteration')::double precision > 0;
  IF v_longest IS NULL THEN
    RETURN;  -- no bubble class that occurs: nothing fits
  END IF;
  FOR v_job IN
    SELECT j.* FROM jobs j
     WHERE j.state = 'running' AND j.memory_bytes <= p_free_bytes
       AND j.item_cost_us <= v_longest
       AND EXISTS (SELECT 1 FROM allowlist a WHERE a.dist_name = j.dist_name
                   AND a.dist_version = j.dist_version AND a.sha256 = j.dist_sha256)
     ORDER BY j.priority DESC, j.deadline ASC NULLS LAST, j.id
  LOOP
    RETURN QUERY
    WITH picked AS (
      SELECT s.shard, uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()) AS secret
        FROM shards s
       WHERE (CASE WHEN s.state = 'pending' THEN s.job_id END) = v_job.id
         AND s.state = 'pending'
       ORDER BY s.shard
       LIMIT v_left
       FOR UPDATE SKIP LOCKED),
    leased AS (
      UPDATE shards s SET state = 'leased', lease_token = nextval('fencing_token'),
             lease_rank = p_rank, lease_login = session_user,
             lease_secret_sha256 = sha256(p.secret), attempts = s.attempts + 1,
             lease_expires = now() + make_interval(secs => v_job.lease_ttl_s)
        FROM picked p
       WHERE s.job_id = v_job.id AND s.shard = p.shard
      RETURNING s.shard, s.lease_token, p.secret, s.lease_secret_sha256, s.item_start,
                s.item_end, s.checkpoint),
    logged AS (
      INSERT INTO attempts (token, job_id, shard, rank, login, secret_sha256, resumed_from)
      SELECT l.lease_token, v_job.id, l.shard, p_rank, session_user, l.lease_secret_sha256,
             coalesce((l.checkpoint ->> 'next')::bigint, l.item_start) - l.item_start
        FROM leased l)
    SELECT v_job.id, l.shard, l.lease_token, encode(l.secret, 'hex'), l.item_start,
           l.item_end, l.checkpoint, v_job.lease_ttl_s, v_job.dist_name, v_job.dist_version,
           v_job.dist_sha256, v_job.entry_point, v_job.params, v_job.dataset,
           v_job.output_dir, v_job.item_count, v_job.item_cost_us
      FROM leased l;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    v_left := v_left - v_got;
    EXIT WHEN v_left <= 0;
  END LOOP;
END $$;

-- The earlier release's lease functions took the token alone: dropped, so that nothing can
-- act on a lease without its secret.
DROP FUNCTION IF EXISTS pipefill.pf_renew(bigint, integer, bigint, jsonb);
DROP FUNCTION IF EXISTS pipefill.pf_commit(bigint, integer, bigint, text, text, bigint);
DROP FUNCTION IF EXISTS pipefill.pf_release(bigint, integer, bigint, jsonb);
DROP FUNCTION IF EXISTS pipefill.pf_fail(bigint, integer, bigint, text);

-- Every write on a lease (renew, commit, release, fail) needs the lease current: the token, the
-- secret (its sha256 matches), the login that claimed it, state leased and not expired. A
-- wrong or missing secret, another login, a stale token or an expired lease all fail alike.
-- A refused call by the lease's own holder (login and secret right) records its attempt's
-- outcome; anyone else's refused call changes nothing.

-- Renew at a durable checkpoint: only while the lease is current.
CREATE OR REPLACE FUNCTION pipefill.pf_renew(p_job bigint, p_shard integer, p_token bigint,
    p_secret text, p_checkpoint jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  IF octet_length(p_checkpoint::text) > 65536 THEN
    RAISE EXCEPTION 'checkpoint of shard %/% is % bytes (at most 65536)', p_job, p_shard,
      octet_length(p_checkpoint::text);
  END IF;
  UPDATE shards s SET checkpoint = coalesce(p_checkpoint, s.checkpoint),
         lease_expires = now() + make_interval(secs => j.lease_ttl_s)
    FROM jobs j
   WHERE s.job_id = p_job AND s.shard = p_shard AND s.lease_token = p_token
     AND s.state = 'leased' AND s.lease_login = session_user
     AND s.lease_secret_sha256 = secret_sha256(p_secret) AND s.lease_expires > now()
     AND j.id = s.job_id AND j.state = 'running';
  IF FOUND THEN
    RETURN true;
  END IF;
  UPDATE attempts SET outcome = CASE WHEN (SELECT state FROM jobs WHERE id = p_job) = 'cancelled'
                                     THEN 'cancelled' ELSE 'fenced' END,
         ended_at = now(), message = coalesce(message, 'renewal refused: lease not current')
   WHERE token = p_token AND job_id = p_job AND login = session_user
     AND secret_sha256 = secret_sha256(p_secret) AND outcome IN ('running', 'fenced');
  RETURN false;
END $$;

-- Commit: one winner per shard, only with the current lease; completes the job with its last
-- shard. The output must lie in the job's folder.
CREATE OR REPLACE FUNCTION pipefill.pf_commit(p_job bigint, p_shard integer, p_token bigint,
    p_secret text, p_path text, p_sha256 text, p_bytes bigint) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
-- 'won': this token's output is the shard's canonical one; 'completed': and it was the job's
-- last shard (the caller exports the manifest); 'refused': the lease is not current (fenced).
DECLARE
  v_dir text;
BEGIN
  IF p_sha256 IS NULL OR p_sha256 !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'commit of shard %/% with sha256 % (not 64 hex digits)', p_job, p_shard,
      left(quote_nullable(p_sha256), 80);
  END IF;
  IF p_bytes IS NULL OR p_bytes < 0 THEN
    RAISE EXCEPTION 'commit of shard %/% with size % bytes', p_job, p_shard, p_bytes;
  END IF;
  SELECT rtrim(output_dir, '/') || '/job-' || p_job || '/' INTO v_dir FROM jobs WHERE id = p_job;
  IF p_path IS NULL OR left(p_path, length(v_dir)) IS DISTINCT FROM v_dir
     OR p_path ~ '(^|/)\.\.?(/|$)' OR length(p_path) > 4096 THEN
    RAISE EXCEPTION 'commit of shard %/% with output path % (not a file in the job''s folder)',
      p_job, p_shard, left(quote_nullable(p_path), 200);
  END IF;
  UPDATE shards s SET state = 'committed', committed_token = p_token, output_path = p_path,
         output_sha256 = p_sha256, output_bytes = p_bytes, committed_at = now(),
         lease_expires = NULL, lease_secret_sha256 = NULL
    FROM jobs j
   WHERE s.job_id = p_job AND s.shard = p_shard AND s.lease_token = p_token
     AND s.state = 'leased' AND s.lease_login = session_user
     AND s.lease_secret_sha256 = secret_sha256(p_secret) AND s.lease_expires > now()
     AND j.id = s.job_id AND j.state = 'running';
  IF NOT FOUND THEN
    -- A retry after a lost reply: the same lease already won with the same output.
    IF EXISTS (SELECT 1 FROM shards s JOIN attempts a ON a.token = s.committed_token
               WHERE s.job_id = p_job AND s.shard = p_shard AND s.state = 'committed'
                 AND s.committed_token = p_token AND s.output_sha256 = p_sha256
                 AND a.login = session_user AND a.secret_sha256 = secret_sha256(p_secret)) THEN
      RETURN CASE WHEN (SELECT state FROM jobs WHERE id = p_job) = 'completed'
                  THEN 'completed' ELSE 'won' END;
    END IF;
    UPDATE attempts SET outcome = 'fenced', ended_at = now(),
           message = 'commit refused: lease not current', output_path = p_path
     WHERE token = p_token AND job_id = p_job AND login = session_user
       AND secret_sha256 = secret_sha256(p_secret) AND outcome IN ('running', 'fenced');
    RETURN 'refused';
  END IF;
  UPDATE attempts SET outcome = 'committed', ended_at = now(), output_path = p_path
   WHERE token = p_token;
  -- The last shard: nothing of the job pending or leased any more (two index probes, not a
  -- scan of the job's shards). Two last commits running at the same time may each still see
  -- the other's shard leased: the sweep completes such a job.
  -- The job's row is skipped when locked: by a cancel (the job ends cancelled), a sweep or
  -- another last commit (either completes it), never waited for (no deadlock with a cancel).
  IF NOT has_pending(p_job) AND NOT has_leased(p_job) THEN
    UPDATE jobs SET state = 'completed', finished_at = now()
     WHERE id = (SELECT id FROM jobs WHERE id = p_job AND state = 'running'
                 FOR UPDATE SKIP LOCKED)
       AND state = 'running';
    IF FOUND THEN
      RETURN 'completed';
    END IF;
  END IF;
  RETURN 'won';
END $$;

-- The winning outputs of a completed job (for the manifest the last committer exports).
CREATE OR REPLACE FUNCTION pipefill.pf_manifest(p_job bigint)
RETURNS TABLE (shard integer, item_start bigint, item_end bigint, token bigint, path text,
               sha256 text, bytes bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
  SELECT s.shard, s.item_start, s.item_end, s.committed_token, s.output_path, s.output_sha256,
         s.output_bytes
    FROM shards s JOIN jobs j ON j.id = s.job_id
   WHERE s.job_id = p_job AND j.state = 'completed'
   ORDER BY s.shard;
$$;

-- Give a lease back (the trainer is stopping): a preemption, never a failure.
CREATE OR REPLACE FUNCTION pipefill.pf_release(p_job bigint, p_shard integer, p_token bigint,
    p_secret text, p_checkpoint jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  IF octet_length(p_checkpoint::text) > 65536 THEN
    RAISE EXCEPTION 'checkpoint of shard %/% is % bytes (at most 65536)', p_job, p_shard,
      octet_length(p_checkpoint::text);
  END IF;
  UPDATE shards SET state = 'pending', lease_expires = NULL, preemptions = preemptions + 1,
         checkpoint = coalesce(p_checkpoint, checkpoint), lease_secret_sha256 = NULL
   WHERE job_id = p_job AND shard = p_shard AND lease_token = p_token AND state = 'leased'
     AND lease_login = session_user AND lease_secret_sha256 = secret_sha256(p_secret)
     AND lease_expires > now();
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  UPDATE attempts SET outcome = 'preempted', ended_at = now() WHERE token = p_token;
  RETURN true;
END $$;

-- The job's code raised: the shard goes back to pending until the job's max_failures, then the
-- job fails with the message (its other shards stop being claimed; other jobs go on).
CREATE OR REPLACE FUNCTION pipefill.pf_fail(p_job bigint, p_shard integer, p_token bigint,
    p_secret text, p_message text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  UPDATE shards SET state = 'pending', lease_expires = NULL, failures = failures + 1,
         lease_secret_sha256 = NULL
   WHERE job_id = p_job AND shard = p_shard AND lease_token = p_token AND state = 'leased'
     AND lease_login = session_user AND lease_secret_sha256 = secret_sha256(p_secret)
     AND lease_expires > now();
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  UPDATE attempts SET outcome = 'failed', ended_at = now(), message = left(p_message, 2000)
   WHERE token = p_token;
  UPDATE jobs SET failures = failures + 1 WHERE id = p_job;
  UPDATE jobs SET state = 'failed', finished_at = now(),
         message = format('failed %s times; last: %s', failures, left(p_message, 2000))
   WHERE id = p_job AND state = 'running' AND failures >= max_failures;
  RETURN true;
END $$;

REVOKE ALL ON FUNCTION pipefill.pf_cancel(bigint), pipefill.pf_advertise(text, bigint, jsonb,
  double precision, bigint, bigint, bigint),
  pipefill.pf_claim(text, bigint, jsonb, integer),
  pipefill.pf_renew(bigint, integer, bigint, text, jsonb),
  pipefill.pf_commit(bigint, integer, bigint, text, text, text, bigint),
  pipefill.pf_release(bigint, integer, bigint, text, jsonb),
  pipefill.pf_fail(bigint, integer, bigint, text, text), pipefill.pf_manifest(bigint),
  pipefill.job_inserted(), pipefill.sweep(), pipefill.bind_rank(text),
  pipefill.has_pending(bigint), pipefill.has_leased(bigint),
  pipefill.secret_sha256(text), pipefill.check_classes(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pipefill.pf_cancel(bigint) TO pf_submitter;
GRANT EXECUTE ON FUNCTION pipefill.pf_advertise(text, bigint, jsonb, double precision, bigint,
  bigint, bigint), pipefill.pf_claim(text, bigint, jsonb, integer),
  pipefill.pf_renew(bigint, integer, bigint, text, jsonb),
  pipefill.pf_commit(bigint, integer, bigint, text, text, text, bigint),
  pipefill.pf_release(bigint, integer, bigint, text, jsonb),
  pipefill.pf_fail(bigint, integer, bigint, text, text), pipefill.pf_manifest(bigint) TO pf_rank;

-- Operators' view: one row per job.
CREATE OR REPLACE VIEW pipefill.job_progress WITH (security_invoker = true) AS
SELECT j.id, j.name, j.owner, j.state, j.priority, j.item_count,
       count(*) AS shards,
       count(*) FILTER (WHERE s.state = 'committed') AS committed,
       count(*) FILTER (WHERE s.state = 'leased') AS leased,
       count(*) FILTER (WHERE s.state = 'pending') AS pending,
       sum(s.attempts) AS attempts, sum(s.expirations) AS expirations,
       sum(s.preemptions) AS preemptions, sum(s.failures) AS failures,
       j.created_at, min(s.committed_at) AS first_commit, max(s.committed_at) AS last_commit,
       j.message
  FROM pipefill.jobs j JOIN pipefill.shards s ON s.job_id = j.id
 GROUP BY j.id;
GRANT SELECT ON pipefill.job_progress TO pf_submitter;
