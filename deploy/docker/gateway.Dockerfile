# The gateway and endpoint picker image, with the compiled request path:
#   docker build -f deploy/docker/gateway.Dockerfile -t kvgate .
#   docker run kvgate gateway --policy /etc/kvgate/policy.yaml    (or: epp --policy ...)
# Its steps are deploy/docker/install-gateway.sh, which `make check-images` runs in CI.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN sh /src/deploy/docker/install-gateway.sh /opt/kvgate /src

FROM python:3.11-slim
COPY --from=build /opt/kvgate /opt/kvgate
ENV PATH=/opt/kvgate/bin:$PATH PYTHONDONTWRITEBYTECODE=1
USER 10001
EXPOSE 8080 8081 9002 9090
ENTRYPOINT ["kvgate"]
CMD ["gateway", "--policy", "/etc/kvgate/policy.yaml"]
