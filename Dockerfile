# Multi-stage build: compile in the Rust image, run in a small Debian image as a non-root user.
# Not built on our machines (they have no Docker engine); kept simple and checked by reading.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY benches ./benches
RUN cargo build --release --locked --bin subagentd

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/subagentd --create-home subagentd
COPY --from=build /src/target/release/subagentd /usr/local/bin/subagentd
USER subagentd
WORKDIR /var/lib/subagentd
ENV SUBAGENTD_LISTEN=0.0.0.0:8080
EXPOSE 8080
# DATABASE_URL must be set: the image carries no PostgreSQL server.
ENTRYPOINT ["subagentd"]
CMD ["serve"]
