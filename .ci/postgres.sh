# Sourced by .ci/run (bash): a throwaway local PostgreSQL server for the tests of the PostgreSQL
# record store. initdb in a temporary folder, the server listening on a unix socket only in that
# folder, stopped and removed when the sourcing shell exits. Exports ANSOR_TEST_POSTGRES_URL; where
# no PostgreSQL server is installed it exports nothing and those tests skip.
#
# Alone: `source .ci/postgres.sh` in an interactive bash, then run pytest in that shell.

ansor_postgres_start() {
    local bindir="${ANSOR_POSTGRES_BIN:-}"
    if [ -z "$bindir" ]; then
        if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
            bindir="$(pg_config --bindir)"
        else
            bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
        fi
    fi
    if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
        echo "postgres.sh: no PostgreSQL server installed; the PostgreSQL store tests will skip" >&2
        return 0
    fi
    ANSOR_POSTGRES_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ansor-pg.XXXXXX")"
    local as_server=()
    if [ "$(id -u)" = 0 ]; then  # the server refuses to run as root
        if ! id postgres >/dev/null 2>&1; then
            echo "postgres.sh: running as root and no postgres user to run the server; the PostgreSQL store tests will skip" >&2
            rm -rf "$ANSOR_POSTGRES_DIR"
            unset ANSOR_POSTGRES_DIR
            return 0
        fi
        chown postgres "$ANSOR_POSTGRES_DIR"
        as_server=(runuser -u postgres --)
    fi
    local user
    user="$("${as_server[@]}" id -un)"
    "${as_server[@]}" "$bindir/initdb" --pgdata "$ANSOR_POSTGRES_DIR/data" --username "$user" \
        --auth trust --encoding UTF8 --no-sync >"$ANSOR_POSTGRES_DIR/initdb.log" 2>&1 \
        || { cat "$ANSOR_POSTGRES_DIR/initdb.log" >&2; return 1; }
    "${as_server[@]}" "$bindir/pg_ctl" --pgdata "$ANSOR_POSTGRES_DIR/data" --wait \
        --log "$ANSOR_POSTGRES_DIR/server.log" \
        --options "-c listen_addresses= -k $ANSOR_POSTGRES_DIR -c fsync=off -c max_connections=100" start \
        >/dev/null || { cat "$ANSOR_POSTGRES_DIR/server.log" >&2; return 1; }
    ANSOR_POSTGRES_BINDIR="$bindir"
    ANSOR_POSTGRES_AS=("${as_server[@]}")
    export ANSOR_TEST_POSTGRES_URL="postgresql:///postgres?host=$ANSOR_POSTGRES_DIR&user=$user"
    echo "postgres.sh: PostgreSQL server at $ANSOR_TEST_POSTGRES_URL" >&2
}

ansor_postgres_stop() {
    if [ -n "${ANSOR_POSTGRES_DIR:-}" ] && [ -d "$ANSOR_POSTGRES_DIR" ]; then
        "${ANSOR_POSTGRES_AS[@]}" "$ANSOR_POSTGRES_BINDIR/pg_ctl" --pgdata "$ANSOR_POSTGRES_DIR/data" \
            --mode immediate --wait stop >/dev/null 2>&1 || true
        rm -rf "$ANSOR_POSTGRES_DIR"
    fi
    unset ANSOR_POSTGRES_DIR ANSOR_TEST_POSTGRES_URL
}

# Stop at exit, after whatever an earlier sourced script asked for at exit (their traps are kept).
ansor_postgres_trap() {
    eval "set -- $(trap -p EXIT)"
    trap "${3:+$3; }ansor_postgres_stop" EXIT
}
ansor_postgres_trap
ansor_postgres_start
