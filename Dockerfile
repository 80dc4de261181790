# Builds the fairway binary; the same image runs the gateway, the simulated
# backend (fairway sim-backend) and the GPU-node agent.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && cp target/release/fairway /fairway

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 fairway
COPY --from=build /fairway /usr/local/bin/fairway
COPY config /etc/fairway
USER fairway
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/fairway"]
CMD ["serve", "--config", "/etc/fairway/compose.toml"]
