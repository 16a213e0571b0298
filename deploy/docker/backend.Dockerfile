# The reference backend image (kvgate's torch engine behind vLLM's OpenAI API):
#   docker build -f deploy/docker/backend.Dockerfile -t kvgate-backend .
#   docker run kvgate-backend backend --runner torch --preset tiny --port 8000
# Its steps are deploy/docker/install-backend.sh, which `make check-images` runs in CI.
FROM python:3.11-slim
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY . /src
RUN PIP_EXTRA_INDEX_URL=$PIP_EXTRA_INDEX_URL sh /src/deploy/docker/install-backend.sh /opt/kvgate /src \
    && rm -rf /src
ENV PATH=/opt/kvgate/bin:$PATH PYTHONDONTWRITEBYTECODE=1
USER 10001
EXPOSE 8000
ENTRYPOINT ["kvgate"]
CMD ["backend", "--runner", "torch", "--preset", "tiny", "--host", "0.0.0.0", "--port", "8000"]
