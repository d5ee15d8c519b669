-- 0002: cluster state. One generic table of namespaced binary values, written by the cluster wiring:
--   dvv/<space>   key -> DVV clock of a replicated key (subscriptions / sessions, retained)
--   fwd/<peer>    zero-padded seq -> a Forward in the durable in-transit buffer of that peer's stream
--   rep/<peer>    zero-padded seq -> a Replicate (queue operation) not yet acked by that replica
--   rs            client id -> replica copy of a session owned by another node (owner, epoch, record)
--   rq/<client>   zero-padded seq -> replica copy of one queued delivery of that session
-- Stream positions (next_seq, committed_upto) and space counters live in `meta`, written in the same batch.
CREATE TABLE cluster_kv (
    ns    TEXT NOT NULL,
    key   TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ns, key)
) WITHOUT ROWID;
