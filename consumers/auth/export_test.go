package auth

import (
	"context"
	"log/slog"
	"time"
)

// What the external tests reach of the internals.
var (
	ParseConfigJWK = parseConfigJWK
	SigningMethods = signingMethods
)

func NewJWKSCache(u string, log *slog.Logger, now func() time.Time) *jwksCache {
	c := newJWKSCache(u, log)
	c.now = now
	return c
}

// SetStale sets how long past JWKSMaxAge the set serves while refetches fail.
func (c *jwksCache) SetStale(d time.Duration) { c.stale = d }

func (c *jwksCache) KeyFor(ctx context.Context, alg, kid string) (any, error) {
	return c.keyFor(ctx, alg, kid)
}

func (k *jwk) VerifyKey(alg string) (any, error) { return k.verifyKey(alg) }
