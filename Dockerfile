# Herald: multi-stage build, runs as a non-root user, SQLite file and .eml directory on a volume.
#   docker build -t herald .
#   docker run --rm -p 8080:8080 -e HERALD_API_TOKEN=change-me -v herald-data:/data herald
# It listens on 0.0.0.0:8080, so HERALD_API_TOKEN is required (herald serve refuses to open /v1/*
# without a token on a non-loopback address). Health: `herald healthcheck` (GET /healthz on
# HERALD_LISTEN, a wildcard address probed on loopback; exit 0/1), so the image needs no curl.
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libpq-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src src
COPY migrations migrations
COPY benches benches
COPY tests tests
RUN cargo build --release --locked --bin herald

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libpq5 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --user-group --uid 10001 --home-dir /data --create-home herald
COPY --from=build /src/target/release/herald /usr/local/bin/herald
# /data (owned by herald, created above) holds herald.db (+ -wal, -shm) and mail/; declared after
# its ownership is set so a fresh named volume starts out writable by the herald user.
RUN mkdir -p /data/mail && chown -R herald:herald /data
VOLUME ["/data"]
USER herald:herald
WORKDIR /data
ENV HERALD_DATABASE_URL=sqlite:///data/herald.db \
    HERALD_LISTEN=0.0.0.0:8080 \
    HERALD_MAIL_DIR=/data/mail
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["herald", "healthcheck"]
ENTRYPOINT ["herald"]
CMD ["serve"]
