# Builds the fairway binary; the same image runs the gateway, the simulated
# backend (fairway sim-backend), the GPU-node agent and the placement service.
# `nvml`: the agent loads NVML (libnvidia-ml.so.1) at run time, which the
# NVIDIA container runtime mounts; without it the agent reports no GPU.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --features nvml && cp target/release/fairway /fairway

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 fairway
COPY --from=build /fairway /usr/local/bin/fairway
COPY config /etc/fairway
USER fairway
# gateway API, gateway admin, agent, placement (HTTPS)
EXPOSE 8080 9090 9400 9443
ENTRYPOINT ["/usr/local/bin/fairway"]
CMD ["serve", "--config", "/etc/fairway/compose.toml"]
