#!/bin/sh
# Starts one of the two processes of a store pod (components/store-sentinel,
# README.md "The store's availability"):
#
#   store.sh valkey-server [option...]   Valkey, as the primary or a replica
#   store.sh valkey-sentinel             the pod's sentinel
#
# Each start writes the process's configuration afresh into $CONF_DIR (an
# emptyDir: the root filesystem is read-only, and the sentinel rewrites its
# file) after asking the other pods' sentinels which pod is the primary
# now, so that a pod that restarts, or is recreated on another node, joins
# the primary the sentinels promoted while it was away rather than the one
# it left. When no sentinel answers, a pod whose server says it is the
# primary (ROLE) is taken; when none does either (the store's first start,
# or every pod restarting at once), pod 0 is the primary and the others
# its replicas.
#
# From the environment: POD_NAME, POD_NAMESPACE (the downward API),
# VALKEY_PASSWORD (Secret fairway-api-keys, FAIRWAY_STORE_PASSWORD: the
# servers' and the sentinels' password, which the gateways send to both),
# and the ConfigMap fairway-store-sentinel's settings: SENTINEL_PRIMARY_NAME,
# SENTINEL_QUORUM, SENTINEL_DOWN_AFTER_MS, SENTINEL_FAILOVER_TIMEOUT_MS,
# STORE_SERVICE, STORE_REPLICAS, CLUSTER_DOMAIN.
set -euf
umask 0077

VALKEY_PORT=6379
SENTINEL_PORT=26379
CONF_DIR=${CONF_DIR:-/run/valkey}
DATA_DIR=${DATA_DIR:-/data}

: "${POD_NAME:?}" "${POD_NAMESPACE:?}" "${VALKEY_PASSWORD:?}"
: "${SENTINEL_PRIMARY_NAME:?}" "${SENTINEL_QUORUM:?}" "${SENTINEL_DOWN_AFTER_MS:?}"
: "${SENTINEL_FAILOVER_TIMEOUT_MS:?}" "${STORE_SERVICE:?}" "${STORE_REPLICAS:?}" "${CLUSTER_DOMAIN:?}"

what=${1:?usage: store.sh valkey-server [option...] | valkey-sentinel}
shift

log() { printf 'store.sh (%s): %s\n' "$what" "$*" >&2; }
# One line of a configuration file (printf: some sh's echo reads escapes).
line() { printf '%s\n' "$*"; }
# A value in a configuration file: double-quoted, \ and " escaped.
quoted() { printf '"%s"' "$(printf '%s' "$1" | sed 's/[\\"]/\\&/g')"; }

# Every pod by its stable name under the headless Service; the sentinels
# and the replicas announce these names, and the gateways are given them.
set_name=${POD_NAME%-*}
ordinal=${POD_NAME##*-}
domain=$STORE_SERVICE.$POD_NAMESPACE.svc.$CLUSTER_DOMAIN
me=$POD_NAME.$domain
host() { printf %s "$set_name-$1.$domain"; }

# valkey-cli with the password, bounded: a pod on a lost node still has its
# DNS record (published before ready), and a connection to it would hang.
cli() {
  if command -v timeout >/dev/null 2>&1; then
    timeout 3 valkey-cli --no-auth-warning -a "$VALKEY_PASSWORD" "$@" 2>/dev/null
  else
    valkey-cli --no-auth-warning -a "$VALKEY_PASSWORD" "$@" 2>/dev/null
  fi
}

# The primary the sentinel of pod host $1 names, or nothing.
sentinel_names() {
  # shellcheck disable=SC2046  # two words: host and port
  set -- $(cli -h "$1" -p "$SENTINEL_PORT" --raw SENTINEL get-master-addr-by-name "$SENTINEL_PRIMARY_NAME" || true)
  [ $# -eq 2 ] || return 0
  case $2 in '' | *[!0-9]*) return 0 ;; esac
  printf %s "$1"
}

# Pod host $1 if its server says it is the primary, or nothing.
is_primary() {
  role=$(cli -h "$1" -p "$VALKEY_PORT" --raw ROLE | head -n 1 || true)
  if [ "$role" = master ]; then printf %s "$1"; fi
}

# The primary now, as "host origin", or nothing:
#   peer  what the other pods' sentinels name (the first that answers);
#   own   what this pod's sentinel names (running when only the server
#         restarts);
#   role  a server that says it is the primary, when no sentinel answers
#         (the sentinel's own server counts; the server's own does not).
current_primary() {
  i=0
  while [ "$i" -lt "$STORE_REPLICAS" ]; do
    if [ "$i" != "$ordinal" ]; then
      p=$(sentinel_names "$(host "$i")")
      if [ -n "$p" ]; then printf '%s peer' "$p"; return; fi
    fi
    i=$((i + 1))
  done
  if [ "$what" = valkey-server ]; then
    p=$(sentinel_names "$me")
    if [ -n "$p" ]; then printf '%s own' "$p"; return; fi
  fi
  i=0
  while [ "$i" -lt "$STORE_REPLICAS" ]; do
    if [ "$i" != "$ordinal" ] || [ "$what" = valkey-sentinel ]; then
      p=$(is_primary "$(host "$i")")
      if [ -n "$p" ]; then printf '%s role' "$p"; return; fi
    fi
    i=$((i + 1))
  done
}

has_data() { [ -d "$DATA_DIR/appendonlydir" ] || [ -f "$DATA_DIR/dump.rdb" ]; }

resolves() {
  if command -v getent >/dev/null 2>&1; then
    getent hosts "$1" >/dev/null 2>&1
  elif command -v nslookup >/dev/null 2>&1; then
    nslookup "$1" >/dev/null 2>&1
  fi
}

waited=0
while :; do
  found=$(current_primary)
  primary=${found% *}
  origin=${found#* }
  # A pod whose volume is empty (lost with its node) must not come back as
  # the primary the sentinels still name: its replicas would copy the empty
  # data set. Wait for the sentinels to promote a replica (they do within
  # down-after-milliseconds and an election of this pod being gone), then
  # join it; after a minute, start anyway.
  if [ "$what" = valkey-server ] && [ "$primary" = "$me" ] && [ "$origin" = peer ] \
    && ! has_data && [ "$waited" -lt 60 ]; then
    [ "$waited" -gt 0 ] || log "the sentinels name this pod, whose volume is empty, the primary: waiting for them to promote a replica"
    sleep 1
    waited=$((waited + 1))
    continue
  fi
  break
done
if [ -z "$primary" ]; then
  primary=$(host 0)
  log "no sentinel names a primary and no server says it is one (a first start, or every pod restarting): $primary"
elif [ "$origin" = role ]; then
  log "no sentinel names a primary; $primary says it is one"
else
  log "the sentinels name $primary the primary"
fi

case $what in
valkey-server)
  conf=$CONF_DIR/valkey.conf
  {
    line "# Written by store.sh at the container's start."
    line "requirepass $(quoted "$VALKEY_PASSWORD")"
    line "masterauth $(quoted "$VALKEY_PASSWORD")"
    line "replica-announce-ip $me"
    line "replica-announce-port $VALKEY_PORT"
    # A primary cut off from every replica for 10 s refuses writes: its
    # gateways' calls fail, so they ask the sentinels again and follow the
    # replica promoted on the other side, instead of writing on into a
    # data set the sentinels will replace (the gateways serve on their
    # local shares meanwhile).
    line "min-replicas-to-write 1"
    line "min-replicas-max-lag 10"
    if [ "$primary" != "$me" ]; then
      line "replicaof $primary $VALKEY_PORT"
    fi
  } >"$conf"
  if [ "$primary" = "$me" ]; then
    log "starting as the primary"
  else
    log "starting as a replica of $primary"
  fi
  # The StatefulSet's arguments (store.yaml: port, persistence, memory)
  # follow the file and take precedence.
  exec valkey-server "$conf" "$@"
  ;;
valkey-sentinel)
  # The sentinel resolves the primary's name when it reads its file: wait
  # for the name (a pod's DNS record appears once it has an address), a
  # minute at most, so that it starts with an address.
  n=0
  until resolves "$primary" || [ "$n" -ge 60 ]; do
    n=$((n + 1))
    sleep 1
  done
  conf=$CONF_DIR/sentinel.conf
  {
    line "# Written by store.sh at the container's start; the sentinel rewrites it."
    line "port $SENTINEL_PORT"
    line "dir $CONF_DIR"
    # The same identity at every start (from the pod's name), so that the
    # other sentinels do not count a restarted sentinel twice: a stale
    # entry would raise the majority a failover needs.
    line "sentinel myid $(printf '%s' "$me" | sha1sum | cut -c1-40)"
    line "sentinel resolve-hostnames yes"
    line "sentinel announce-hostnames yes"
    line "sentinel announce-ip $me"
    line "sentinel announce-port $SENTINEL_PORT"
    line "requirepass $(quoted "$VALKEY_PASSWORD")"
    line "sentinel monitor $SENTINEL_PRIMARY_NAME $primary $VALKEY_PORT $SENTINEL_QUORUM"
    line "sentinel auth-pass $SENTINEL_PRIMARY_NAME $(quoted "$VALKEY_PASSWORD")"
    line "sentinel down-after-milliseconds $SENTINEL_PRIMARY_NAME $SENTINEL_DOWN_AFTER_MS"
    line "sentinel failover-timeout $SENTINEL_PRIMARY_NAME $SENTINEL_FAILOVER_TIMEOUT_MS"
    line "sentinel parallel-syncs $SENTINEL_PRIMARY_NAME 1"
  } >"$conf"
  exec valkey-server "$conf" --sentinel
  ;;
*)
  log "unknown process"
  exit 2
  ;;
esac
