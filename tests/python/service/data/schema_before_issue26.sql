-- The fill-job service's schema (docs/service.md). Applied once by the service's owner role
-- (`pipefill service init`); every statement is idempotent so a rerun upgrades nothing and
-- breaks nothing.
--
-- Roles: pf_submitter (members create, read and cancel their own jobs: row-level security on
-- owner = session_user), pf_rank (members hold no table privilege at all: they can only call the
-- SECURITY DEFINER functions pf_advertise / pf_claim / pf_renew / pf_commit / pf_release /
-- pf_fail, which check the fencing token on every write). The owner (whoever runs this script)
-- manages the allowlist.

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
CREATE INDEX IF NOT EXISTS shards_claimable ON pipefill.shards (job_id, shard)
  WHERE state IN ('pending', 'leased');

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
  IF NEW.item_count / NEW.shard_items > 10000000 THEN
    RAISE EXCEPTION 'job % would have % shards (more than 10000000): raise shard_items',
      NEW.name, NEW.item_count / NEW.shard_items;
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
CREATE OR REPLACE FUNCTION pipefill.pf_cancel(p_job bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  UPDATE jobs SET state = 'cancelled', finished_at = now(), message = 'cancelled by ' || session_user
   WHERE id = p_job AND owner = session_user AND state = 'running';
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  UPDATE shards SET state = 'cancelled' WHERE job_id = p_job AND state IN ('pending', 'leased');
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

DROP FUNCTION IF EXISTS pipefill.pf_advertise(text, bigint, double precision, double precision,
  double precision);
CREATE OR REPLACE FUNCTION pipefill.pf_advertise(p_rank text, p_free_bytes bigint,
    p_classes jsonb, p_iterations_per_s double precision, p_arena_bytes bigint,
    p_device_free_bytes bigint, p_device_total_bytes bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  PERFORM check_classes(p_classes);
  INSERT INTO ranks (rank, free_bytes, bubble_p10_us, bubbles_per_iteration, iterations_per_s,
                     seen_at, classes, arena_bytes, device_free_bytes, device_total_bytes)
  SELECT p_rank, p_free_bytes,
         coalesce(max((c ->> 'p10_us')::double precision), 0),
         coalesce(sum((c ->> 'per_iteration')::double precision), 0),
         p_iterations_per_s, now(), p_classes, p_arena_bytes, p_device_free_bytes,
         p_device_total_bytes
    FROM jsonb_array_elements(p_classes) AS c
  ON CONFLICT (rank) DO UPDATE SET free_bytes = EXCLUDED.free_bytes,
    bubble_p10_us = EXCLUDED.bubble_p10_us,
    bubbles_per_iteration = EXCLUDED.bubbles_per_iteration,
    iterations_per_s = EXCLUDED.iterations_per_s, seen_at = now(), classes = EXCLUDED.classes,
    arena_bytes = EXCLUDED.arena_bytes, device_free_bytes = EXCLUDED.device_free_bytes,
    device_total_bytes = EXCLUDED.device_total_bytes;
END $$;

-- Claim up to p_limit shards that fit (memory, and one item within the p10 duration of one of
-- the rank's bubble classes that occurs every iteration or so) from running, allowlisted jobs:
-- pending ones, or leased ones whose lease expired. SKIP LOCKED: concurrent claimers never wait
-- on each other's rows. Each claim gets a new fencing token.
DROP FUNCTION IF EXISTS pipefill.pf_claim(text, bigint, double precision, integer);
CREATE OR REPLACE FUNCTION pipefill.pf_claim(p_rank text, p_free_bytes bigint,
    p_classes jsonb, p_limit integer)
RETURNS TABLE (job_id bigint, shard integer, token bigint, item_start bigint, item_end bigint,
               checkpoint jsonb, lease_ttl_s double precision, dist_name text,
               dist_version text, dist_sha256 text, entry_point text, params jsonb,
               dataset text, output_dir text, item_count bigint, item_cost_us double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
#variable_conflict use_column
BEGIN
  IF p_limit < 1 OR p_limit > 1000 THEN
    RAISE EXCEPTION 'claim limit % is outside [1, 1000]', p_limit;
  END IF;
  PERFORM check_classes(p_classes);
  RETURN QUERY
  WITH picked AS (
    SELECT s.job_id, s.shard, s.state AS old_state
      FROM shards s JOIN jobs j ON j.id = s.job_id
     WHERE j.state = 'running'
       AND (s.state = 'pending' OR (s.state = 'leased' AND s.lease_expires < now()))
       AND j.memory_bytes <= p_free_bytes
       AND EXISTS (SELECT 1 FROM jsonb_array_elements(p_classes) c
                    WHERE (c ->> 'p10_us')::double precision >= j.item_cost_us
                      AND (c ->> 'per_iteration')::double precision > 0)
       AND EXISTS (SELECT 1 FROM allowlist a WHERE a.dist_name = j.dist_name
                   AND a.dist_version = j.dist_version AND a.sha256 = j.dist_sha256)
     ORDER BY j.priority DESC, j.deadline ASC NULLS LAST, s.job_id, s.shard
     LIMIT p_limit
     FOR UPDATE OF s SKIP LOCKED),
  leased AS (
    UPDATE shards s SET state = 'leased', lease_token = nextval('fencing_token'),
           lease_rank = p_rank, attempts = s.attempts + 1,
           expirations = s.expirations + (p.old_state = 'leased')::integer,
           lease_expires = now() + make_interval(secs => j.lease_ttl_s)
      FROM picked p, jobs j
     WHERE s.job_id = p.job_id AND s.shard = p.shard AND j.id = s.job_id
    RETURNING s.job_id, s.shard, s.lease_token, s.item_start, s.item_end, s.checkpoint,
              j.lease_ttl_s, j.dist_name, j.dist_version, j.dist_sha256, j.entry_point,
              j.params, j.dataset, j.output_dir, j.item_count, j.item_cost_us),
  expired AS (
    UPDATE attempts a SET outcome = 'fenced', ended_at = now(),
           message = 'lease expired; shard re-claimed by ' || p_rank
      FROM leased l WHERE a.job_id = l.job_id AND a.shard = l.shard AND a.outcome = 'running'),
  logged AS (
    INSERT INTO attempts (token, job_id, shard, rank, resumed_from)
    SELECT l.lease_token, l.job_id, l.shard, p_rank,
           coalesce((l.checkpoint ->> 'next')::bigint, l.item_start) - l.item_start
      FROM leased l)
  SELECT * FROM leased;
END $$;

-- Renew at a durable checkpoint: only while the token is current.
CREATE OR REPLACE FUNCTION pipefill.pf_renew(p_job bigint, p_shard integer, p_token bigint,
    p_checkpoint jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  UPDATE shards s SET checkpoint = coalesce(p_checkpoint, s.checkpoint),
         lease_expires = now() + make_interval(secs => j.lease_ttl_s)
    FROM jobs j
   WHERE s.job_id = p_job AND s.shard = p_shard AND s.lease_token = p_token
     AND s.state = 'leased' AND j.id = s.job_id AND j.state = 'running';
  IF FOUND THEN
    RETURN true;
  END IF;
  UPDATE attempts SET outcome = CASE WHEN (SELECT state FROM jobs WHERE id = p_job) = 'cancelled'
                                     THEN 'cancelled' ELSE 'fenced' END,
         ended_at = now(), message = coalesce(message, 'renewal refused: token not current')
   WHERE token = p_token AND outcome IN ('running', 'fenced');
  RETURN false;
END $$;

-- Commit: one winner per shard, only with the current token; completes the job with its last
-- shard.
CREATE OR REPLACE FUNCTION pipefill.pf_commit(p_job bigint, p_shard integer, p_token bigint,
    p_path text, p_sha256 text, p_bytes bigint) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
-- 'won': this token's output is the shard's canonical one; 'completed': and it was the job's
-- last shard (the caller exports the manifest); 'refused': the token is not current (fenced).
BEGIN
  IF p_sha256 !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'commit of shard %/% with sha256 % (not 64 hex digits)', p_job, p_shard,
      p_sha256;
  END IF;
  UPDATE shards s SET state = 'committed', committed_token = p_token, output_path = p_path,
         output_sha256 = p_sha256, output_bytes = p_bytes, committed_at = now(),
         lease_expires = NULL
    FROM jobs j
   WHERE s.job_id = p_job AND s.shard = p_shard AND s.lease_token = p_token
     AND s.state = 'leased' AND j.id = s.job_id AND j.state = 'running';
  IF NOT FOUND THEN
    -- A retry after a lost reply: the same token already won with the same output.
    IF EXISTS (SELECT 1 FROM shards WHERE job_id = p_job AND shard = p_shard
               AND state = 'committed' AND committed_token = p_token
               AND output_sha256 = p_sha256) THEN
      RETURN CASE WHEN (SELECT state FROM jobs WHERE id = p_job) = 'completed'
                  THEN 'completed' ELSE 'won' END;
    END IF;
    UPDATE attempts SET outcome = 'fenced', ended_at = now(),
           message = 'commit refused: token not current', output_path = p_path
     WHERE token = p_token AND outcome IN ('running', 'fenced');
    RETURN 'refused';
  END IF;
  UPDATE attempts SET outcome = 'committed', ended_at = now(), output_path = p_path
   WHERE token = p_token;
  UPDATE jobs SET state = 'completed', finished_at = now()
   WHERE id = p_job AND state = 'running'
     AND NOT EXISTS (SELECT 1 FROM shards WHERE job_id = p_job AND state <> 'committed');
  RETURN CASE WHEN FOUND THEN 'completed' ELSE 'won' END;
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
    p_checkpoint jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
BEGIN
  UPDATE shards SET state = 'pending', lease_expires = NULL, preemptions = preemptions + 1,
         checkpoint = coalesce(p_checkpoint, checkpoint)
   WHERE job_id = p_job AND shard = p_shard AND lease_token = p_token AND state = 'leased';
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  UPDATE attempts SET outcome = 'preempted', ended_at = now() WHERE token = p_token;
  RETURN true;
END $$;

-- The job's code raised: the shard goes back to pending until the job's max_failures, then the
-- job fails with the message (its other shards stop being claimed; other jobs go on).
CREATE OR REPLACE FUNCTION pipefill.pf_fail(p_job bigint, p_shard integer, p_token bigint,
    p_message text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pipefill, pg_temp AS $$
DECLARE
  total integer;
BEGIN
  UPDATE shards SET state = 'pending', lease_expires = NULL, failures = failures + 1
   WHERE job_id = p_job AND shard = p_shard AND lease_token = p_token AND state = 'leased';
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  UPDATE attempts SET outcome = 'failed', ended_at = now(), message = left(p_message, 2000)
   WHERE token = p_token;
  SELECT sum(failures) INTO total FROM shards WHERE job_id = p_job;
  UPDATE jobs SET state = 'failed', finished_at = now(),
         message = format('failed %s times; last: %s', total, left(p_message, 2000))
   WHERE id = p_job AND state = 'running' AND total >= max_failures;
  RETURN true;
END $$;

REVOKE ALL ON FUNCTION pipefill.pf_cancel(bigint), pipefill.pf_advertise(text, bigint, jsonb,
  double precision, bigint, bigint, bigint),
  pipefill.pf_claim(text, bigint, jsonb, integer),
  pipefill.pf_renew(bigint, integer, bigint, jsonb),
  pipefill.pf_commit(bigint, integer, bigint, text, text, bigint),
  pipefill.pf_release(bigint, integer, bigint, jsonb),
  pipefill.pf_fail(bigint, integer, bigint, text), pipefill.pf_manifest(bigint),
  pipefill.job_inserted() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pipefill.pf_cancel(bigint) TO pf_submitter;
GRANT EXECUTE ON FUNCTION pipefill.pf_advertise(text, bigint, jsonb, double precision, bigint,
  bigint, bigint), pipefill.pf_claim(text, bigint, jsonb, integer),
  pipefill.pf_renew(bigint, integer, bigint, jsonb),
  pipefill.pf_commit(bigint, integer, bigint, text, text, bigint),
  pipefill.pf_release(bigint, integer, bigint, jsonb),
  pipefill.pf_fail(bigint, integer, bigint, text), pipefill.pf_manifest(bigint) TO pf_rank;

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
