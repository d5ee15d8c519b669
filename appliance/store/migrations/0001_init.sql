-- 0001: initial schema. One row per durable session, subscription, queued delivery, retained message,
-- incoming QoS2 packet id and node-level key. Queue rows carry the whole message (denormalised) so that a
-- restart rebuilds every offline queue and inflight window from one ordered scan.

CREATE TABLE sessions (
    client_id        TEXT PRIMARY KEY,
    protocol_version INTEGER NOT NULL,
    expiry_interval  INTEGER NOT NULL,
    disconnected_at  REAL,
    will             TEXT,     -- JSON: topic, payload (base64), qos, retain, properties
    will_due_at      REAL,
    username         TEXT,
    next_seq         INTEGER NOT NULL DEFAULT 1
) WITHOUT ROWID;

CREATE TABLE subscriptions (
    client_id           TEXT NOT NULL,
    topic_filter        TEXT NOT NULL,
    qos                 INTEGER NOT NULL,
    no_local            INTEGER NOT NULL DEFAULT 0,
    retain_as_published INTEGER NOT NULL DEFAULT 0,
    retain_handling     INTEGER NOT NULL DEFAULT 0,
    subscription_id     INTEGER,
    PRIMARY KEY (client_id, topic_filter)
) WITHOUT ROWID;

CREATE TABLE queue (
    client_id        TEXT NOT NULL,
    seq              INTEGER NOT NULL,
    msg_id           TEXT NOT NULL,
    topic            TEXT NOT NULL,
    payload          BLOB NOT NULL,
    msg_qos          INTEGER NOT NULL,
    msg_retain       INTEGER NOT NULL,
    publisher        TEXT NOT NULL,
    created          REAL NOT NULL,
    expiry_at        REAL,
    properties       TEXT,     -- JSON of the non-default Properties fields, NULL when all default
    qos              INTEGER NOT NULL,  -- effective QoS
    retain           INTEGER NOT NULL,  -- RETAIN flag to send
    subscription_ids TEXT,     -- comma-separated, NULL when none
    packet_id        INTEGER,
    state            INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (client_id, seq)
) WITHOUT ROWID;

CREATE TABLE retained (
    topic      TEXT PRIMARY KEY,
    msg_id     TEXT NOT NULL,
    payload    BLOB NOT NULL,
    qos        INTEGER NOT NULL,
    retain     INTEGER NOT NULL,
    publisher  TEXT NOT NULL,
    created    REAL NOT NULL,
    expiry_at  REAL,
    properties TEXT
);

CREATE TABLE incoming_qos2 (
    client_id  TEXT NOT NULL,
    packet_id  INTEGER NOT NULL,
    msg_id     TEXT,      -- NULL: packet id held with no message (already routed, awaiting PUBREL)
    topic      TEXT,
    payload    BLOB,
    qos        INTEGER,
    retain     INTEGER,
    publisher  TEXT,
    created    REAL,
    expiry_at  REAL,
    properties TEXT,
    PRIMARY KEY (client_id, packet_id)
) WITHOUT ROWID;

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
