# The jetsync image for docker-compose.yml: one static binary (CGO_ENABLED=0:
# the SQLite driver is pure Go) on Alpine, whose busybox wget serves the
# compose health checks.
# The demo page (web/demo), bundled by esbuild from npm as `make` does, for
# the binary to embed.
FROM node:22-alpine AS web
WORKDIR /src/web/demo
COPY web/demo/package.json web/demo/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY web/demo/ ./
RUN node build.mjs

FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
COPY --from=web /src/cmd/jetsync/demoweb/ ./cmd/jetsync/demoweb/
# jetsync --version's revision: docker build --build-arg REVISION=$(git rev-parse HEAD)
ARG REVISION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.buildRevision=${REVISION}" -o /out/jetsync ./cmd/jetsync

FROM alpine:3.22
RUN adduser -D -H -u 10001 jetsync && mkdir /data && chown jetsync /data
COPY --from=build /out/jetsync /usr/local/bin/jetsync
USER jetsync
WORKDIR /data
ENV JETSYNC_DATA_DIR=/data
# 4848: the sync endpoint (view-syncer, proxy); 4849: the change-streamer's
# health and metrics; 4851: demo-api.
EXPOSE 4848 4849 4851
VOLUME /data
ENTRYPOINT ["jetsync"]
