# Multi-stage build: compile in the Rust image, run in a small Debian image as a non-root user.
#   docker build -t subagentd .        (or podman build --format docker: the OCI default drops HEALTHCHECK)
FROM rust:1-bookworm AS build
WORKDIR /src
# The dependencies first, in a layer of their own: a change to the service's sources does not
# rebuild them. Stand-in sources make Cargo build every dependency; they are removed after.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs && echo 'fn main() {}' > benches/load.rs \
 && cargo build --release --locked --bin subagentd \
 && rm -rf src benches target/release/subagentd* target/release/deps/subagentd-* \
           target/release/deps/libsubagentd-* target/release/.fingerprint/subagentd-*
# Then the service itself (the sources, the migrations and openapi.yaml it embeds), with the
# checked queries' offline data: the build needs no database.
COPY src ./src
COPY migrations ./migrations
COPY .sqlx ./.sqlx
COPY benches ./benches
COPY openapi.yaml subagentd.example.toml ./
RUN touch src/main.rs src/lib.rs && SQLX_OFFLINE=true cargo build --release --locked --bin subagentd

# The image: the one binary, CA certificates, bubblewrap and gVisor's runsc (run_command's sandbox: bubblewrap unless
# SUBAGENTD_SANDBOX_RUNTIME=gvisor), a user of its own. State lives only in PostgreSQL (DATABASE_URL), so the root
# filesystem may be mounted read-only.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates bubblewrap runsc \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/subagentd --create-home subagentd \
 && install -d -o 10001 -g 10001 /var/lib/subagentd/.subagentd
COPY --from=build /src/target/release/subagentd /usr/local/bin/subagentd
USER 10001
WORKDIR /var/lib/subagentd
ENV SUBAGENTD_LISTEN=0.0.0.0:8080
EXPOSE 8080
# `subagentd healthcheck` asks /readyz on the listen address: no shell, no curl in the image.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["subagentd", "healthcheck"]
# DATABASE_URL must be set: the image carries no PostgreSQL server.
ENTRYPOINT ["subagentd"]
CMD ["serve"]
