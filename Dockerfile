# Herald: multi-stage build, runs as a non-root user.
#   docker build -t herald .
#   docker run --rm -p 8080:8080 -e HERALD_API_TOKEN=change-me -v herald-data:/data herald
# It listens on 0.0.0.0:8080, so HERALD_API_TOKEN is required (herald serve refuses to open /v1/*
# without a token on a non-loopback address).
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libpq-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY migrations migrations
COPY benches benches
COPY tests tests
RUN cargo build --release --locked --bin herald

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libpq5 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --create-home herald
COPY --from=build /src/target/release/herald /usr/local/bin/herald
USER herald
WORKDIR /data
ENV HERALD_DATABASE_URL=sqlite:///data/herald.db \
    HERALD_LISTEN=0.0.0.0:8080 \
    HERALD_MAIL_DIR=/data/mail
EXPOSE 8080
ENTRYPOINT ["herald"]
CMD ["serve"]
