// Package appapi is jetsync's client of the app's API server: the query
// endpoint (ZERO_QUERY_URL), which turns synced queries (name and args) into
// ASTs, and the mutate endpoint (ZERO_MUTATE_URL), which runs custom
// mutators. It follows zero-cache 1.9.0's fetchFromAPIServer,
// CustomQueryTransformer and PusherService (docs/protocol.md §14): the same
// URL choice and allow-list, headers, retries, error bodies, response
// shapes, transform cache and push batching.
//
// What is per connection or per client group (auth state, validation,
// pinning the user, retransform deadlines, pipelines and the transformation
// hash bookkeeping) stays with the caller, the view-syncer, as it does in
// zero-cache's connection context manager and view-syncer.
package appapi

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults of Config.
const (
	DefaultAppID            = "zero"
	DefaultMaxAttempts      = 4
	DefaultAttemptTimeout   = 30 * time.Second
	DefaultRequestTimeout   = time.Minute
	DefaultMaxResponseBytes = 32 << 20
	DefaultCacheTTL         = 5 * time.Second
	// bodyPreviewChars is how much of a non-2xx body the error carries.
	bodyPreviewChars = 512
)

// Endpoint configures one API endpoint (ZERO_QUERY_* or ZERO_MUTATE_*).
type Endpoint struct {
	// URLs are the allowed URL patterns (Pattern); the first is also the URL
	// used when the client gives none. Empty means the endpoint is not
	// configured.
	URLs []string
	// APIKey is sent as X-Api-Key when set.
	APIKey string
	// ForwardCookies forwards the websocket upgrade request's Cookie header.
	ForwardCookies bool
	// AllowedClientHeaders lists the header names (case-insensitive) that
	// the client's userQueryHeaders/userPushHeaders may set. None when empty.
	AllowedClientHeaders []string
	// AllowedRequestHeaders lists the header names (case-insensitive) copied
	// from the websocket upgrade request. None when empty.
	AllowedRequestHeaders []string
}

// Configured reports whether the endpoint has a URL.
func (e Endpoint) Configured() bool { return len(e.URLs) > 0 }

// Config configures a Client.
type Config struct {
	Query  Endpoint
	Mutate Endpoint
	// AppID and ShardNum name the upstream schema <app>_<shard>, which every
	// request carries as ?schema=<app>_<shard>&appID=<app>.
	AppID    string
	ShardNum int
	// MaxAttempts bounds the attempts of one request; 5xx responses and
	// network failures (timeouts included) are retried.
	MaxAttempts int
	// AttemptTimeout bounds one attempt, body included. zero-cache has no
	// timeout of its own (Node's fetch gives up on headers after 300 s).
	AttemptTimeout time.Duration
	// RequestTimeout bounds a whole request: its attempts and the pauses
	// between them. A caller's own deadline may end it sooner.
	RequestTimeout time.Duration
	// MaxResponseBytes bounds a 2xx response body; a larger one is a parse
	// failure.
	MaxResponseBytes int64
	// CacheTTL is how long a transformed query is reused for the same
	// request identity. Negative disables the cache.
	CacheTTL time.Duration
	// HTTPClient sends the requests; nil means a client of its own, whose
	// Timeout is AttemptTimeout. AttemptTimeout bounds each attempt.
	HTTPClient *http.Client
	Logger     *slog.Logger
}

var appIDRe = regexp.MustCompile(`^[a-z0-9_]+$`)

// Validate checks the configuration, compiling every URL pattern.
func (c Config) Validate() error {
	if c.AppID != "" && !appIDRe.MatchString(c.AppID) {
		return fmt.Errorf("app ID %q: only lower-case letters, digits and _ are allowed", c.AppID)
	}
	if c.ShardNum < 0 {
		return fmt.Errorf("shard number %d is negative", c.ShardNum)
	}
	if c.MaxAttempts < 0 || c.AttemptTimeout < 0 || c.RequestTimeout < 0 || c.MaxResponseBytes < 0 {
		return errors.New("max attempts, attempt and request timeouts and max response bytes must not be negative")
	}
	for _, e := range []struct {
		name string
		ep   Endpoint
	}{{"ZERO_QUERY_URL", c.Query}, {"ZERO_MUTATE_URL", c.Mutate}} {
		for _, u := range e.ep.URLs {
			if _, err := CompilePattern(u); err != nil {
				return fmt.Errorf("%s: %w", e.name, err)
			}
			if err := checkReserved(u); err != nil {
				return fmt.Errorf("%s: %w", e.name, err)
			}
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.AppID = cmp.Or(c.AppID, DefaultAppID)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.AttemptTimeout = cmp.Or(c.AttemptTimeout, DefaultAttemptTimeout)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, DefaultMaxResponseBytes)
	c.CacheTTL = cmp.Or(c.CacheTTL, DefaultCacheTTL)
	// The attempt's context bounds the exchange; the client's Timeout is
	// there for what escapes it.
	c.HTTPClient = cmp.Or(c.HTTPClient, &http.Client{Timeout: c.AttemptTimeout})
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Conn is what a request carries from the connection it is made for.
type Conn struct {
	// UserID is the connection's URL userID; "" means none (logged out).
	UserID string
	// Token is the raw auth token (JWT or opaque), sent as
	// "Authorization: Bearer <token>" when not empty.
	Token string
	// Cookie is the upgrade request's Cookie header, forwarded only when the
	// endpoint's ForwardCookies is set.
	Cookie string
	// Origin is the upgrade request's Origin header, forwarded when set.
	Origin string
	// RequestHeader is the upgrade request's header; only the endpoint's
	// AllowedRequestHeaders are forwarded.
	RequestHeader http.Header
}

// ConnFromRequest builds a Conn from the websocket upgrade request.
func ConnFromRequest(r *http.Request, userID, token string) Conn {
	return Conn{
		UserID:        userID,
		Token:         token,
		Cookie:        strings.Join(r.Header.Values("Cookie"), "; "),
		Origin:        r.Header.Get("Origin"),
		RequestHeader: r.Header,
	}
}

// Validation says how a successful response vouches for the user.
type Validation struct {
	// Server is true when the response named the user (it had a userID):
	// the caller checks that it equals the connection's userID and pins it.
	// Otherwise the connection's URL userID is trusted ("client-fallback").
	Server bool
	// UserID is the user the response named; nil means logged out.
	UserID *string
}

// Client calls the app's API server. It is safe for concurrent use.
type Client struct {
	cfg    Config
	query  []*Pattern
	mutate []*Pattern
	cache  *transformCache

	// Test hooks: the clock and the delay before a retry.
	now     func() time.Time
	backoff func(attempt int) time.Duration
}

// New validates cfg and returns a Client.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Client{cfg: cfg, now: time.Now, backoff: backoffDelay}
	for _, u := range cfg.Query.URLs {
		p, _ := CompilePattern(u)
		c.query = append(c.query, p)
	}
	for _, u := range cfg.Mutate.URLs {
		p, _ := CompilePattern(u)
		c.mutate = append(c.mutate, p)
	}
	c.cache = newTransformCache(cfg.CacheTTL)
	return c, nil
}

// Config returns the configuration with defaults applied.
func (c *Client) Config() Config { return c.cfg }

// QueryConfigured reports whether c has a query endpoint; a nil Client has
// none.
func (c *Client) QueryConfigured() bool { return c != nil && c.cfg.Query.Configured() }

// MutateConfigured reports whether c has a mutate endpoint; a nil Client
// has none.
func (c *Client) MutateConfigured() bool { return c != nil && c.cfg.Mutate.Configured() }

// QueryAllowed reports whether a userQueryURL may be used.
func (c *Client) QueryAllowed(rawURL string) bool { return matchAny(c.query, rawURL) }

// MutateAllowed reports whether a userPushURL may be used.
func (c *Client) MutateAllowed(rawURL string) bool { return matchAny(c.mutate, rawURL) }

// backoffDelay is zero-cache's min(1000, 100·2^(attempt-1) + U[0,100)) ms.
func backoffDelay(attempt int) time.Duration {
	ms := 100*float64(int(1)<<(attempt-1)) + rand.Float64()*100
	return time.Duration(min(1000, ms) * float64(time.Millisecond))
}

// source is the endpoint a request goes to; it decides the URLs, header
// options and the kind of Failure.
type source int

const (
	sourceTransform source = iota
	sourcePush
)

func (s source) kind() string {
	if s == sourcePush {
		return KindPushFailed
	}
	return KindTransformFailed
}

// request is one call to the API server.
type request struct {
	src           source
	conn          Conn
	url           string            // the client's URL; "" means the first configured
	clientHeaders map[string]string // userQueryHeaders / userPushHeaders
	traceparent   string
	body          any
}

// effective is the request identity after the configuration's rules: what
// actually goes on the wire, and what the transform cache is keyed by.
type effective struct {
	url            string
	apiKey         string
	customHeaders  [][2]string
	requestHeaders [][2]string
	token          string
	cookie         string
	origin         string
}

func (c *Client) effective(r request) effective {
	ep := c.cfg.Query
	if r.src == sourcePush {
		ep = c.cfg.Mutate
	}
	e := effective{url: r.url, apiKey: ep.APIKey, token: r.conn.Token, origin: r.conn.Origin}
	if e.url == "" && len(ep.URLs) > 0 {
		e.url = ep.URLs[0]
	}
	if ep.ForwardCookies {
		e.cookie = r.conn.Cookie
	}
	allowed := func(list []string, name string) bool {
		for _, a := range list {
			if strings.EqualFold(a, name) {
				return true
			}
		}
		return false
	}
	for k, v := range r.clientHeaders {
		if allowed(ep.AllowedClientHeaders, k) {
			e.customHeaders = append(e.customHeaders, [2]string{k, v})
		}
	}
	for k, vs := range r.conn.RequestHeader {
		if allowed(ep.AllowedRequestHeaders, k) {
			e.requestHeaders = append(e.requestHeaders, [2]string{k, strings.Join(vs, ", ")})
		}
	}
	sortPairs(e.customHeaders)
	sortPairs(e.requestHeaders)
	return e
}

func sortPairs(p [][2]string) {
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && strings.ToLower(p[j][0]) < strings.ToLower(p[j-1][0]); j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}

// header builds the request headers in zero-cache's order, later ones
// winning: Content-Type, X-Api-Key, the client's allowed custom headers, the
// allowed upgrade-request headers, Authorization, Cookie, Origin,
// traceparent.
func (e effective) header(traceparent string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if e.apiKey != "" {
		h.Set("X-Api-Key", e.apiKey)
	}
	for _, kv := range e.customHeaders {
		h.Set(kv[0], kv[1])
	}
	for _, kv := range e.requestHeaders {
		h.Set(kv[0], kv[1])
	}
	if e.token != "" {
		h.Set("Authorization", "Bearer "+e.token)
	}
	if e.cookie != "" {
		h.Set("Cookie", e.cookie)
	}
	if e.origin != "" {
		h.Set("Origin", e.origin)
	}
	if traceparent != "" {
		h.Set("Traceparent", traceparent)
	}
	return h
}

var reservedParams = []string{"schema", "appID"}

func checkReserved(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil // a pattern, not a URL; the request URL is checked again
	}
	q := u.Query()
	for _, p := range reservedParams {
		if q.Has(p) {
			return fmt.Errorf("the push URL cannot contain the reserved query param %q", p)
		}
	}
	return nil
}

// post sends r and returns a 2xx body. Its error is a *Failure without ids
// for failures of the exchange (URL refused, non-2xx, network), or a plain
// error for a configuration problem, which callers report as zero-cache
// does ("Failed to transform queries: ..." / "Failed to push: ...").
func (c *Client) post(ctx context.Context, r request) ([]byte, error) {
	e := c.effective(r)
	kind := r.src.kind()
	if e.url == "" {
		if r.src == sourcePush {
			return nil, errors.New("ZERO_MUTATE_URL is not set")
		}
		return nil, errors.New("Fetch config for transform is missing URL")
	}
	patterns, setting := c.query, "ZERO_QUERY_URL"
	if r.src == sourcePush {
		patterns, setting = c.mutate, "ZERO_MUTATE_URL"
	}
	if !matchAny(patterns, e.url) {
		return nil, newFailure(kind, ReasonInternal,
			fmt.Sprintf("URL %q is not allowed by the %s configuration", e.url, setting), nil)
	}
	u, err := url.Parse(e.url)
	if err != nil {
		return nil, fmt.Errorf("parse URL %q: %w", e.url, err)
	}
	if err := checkReserved(e.url); err != nil {
		return nil, err
	}
	// Keep the URL's own parameters in their order, then append ours, as
	// URLSearchParams.append does.
	add := "schema=" + url.QueryEscape(c.cfg.AppID+"_"+strconv.Itoa(c.cfg.ShardNum)) +
		"&appID=" + url.QueryEscape(c.cfg.AppID)
	if u.RawQuery != "" {
		u.RawQuery += "&" + add
	} else {
		u.RawQuery = add
	}
	u.Fragment, u.RawFragment = "", ""
	final := u.String()

	payload, err := json.Marshal(r.body)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	header := e.header(r.traceparent)
	log := c.cfg.Logger.With("url", final, "source", kind)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		body, retry, err := c.attempt(ctx, final, header, payload, kind)
		if err == nil {
			return body, nil
		}
		if !retry || attempt >= c.cfg.MaxAttempts || ctx.Err() != nil {
			return nil, err
		}
		d := c.backoff(attempt)
		log.Debug("API server request failed, retrying", "attempt", attempt, "delay", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, newFailure(kind, ReasonInternal,
				"Fetch from API server threw error: "+ctx.Err().Error(), ctx.Err())
		case <-t.C:
		}
	}
}

// attempt makes one HTTP exchange. retry says whether zero-cache would try
// again: on 5xx and on network failures, never on 4xx or a bad body.
func (c *Client) attempt(ctx context.Context, rawURL string, header http.Header, payload []byte, kind string) (body []byte, retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rawURL, bytes.NewReader(payload))
	if err != nil {
		return nil, false, newFailure(kind, ReasonInternal, "Fetch from API server threw error: "+err.Error(), err)
	}
	req.Header = header.Clone()
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, true, newFailure(kind, ReasonInternal, "Fetch from API server threw error: "+err.Error(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		f := newFailure(kind, ReasonHTTP,
			fmt.Sprintf("Fetch from API server returned non-OK status %d", resp.StatusCode), nil)
		f.Status = resp.StatusCode
		f.BodyPreview = bodyPreview(resp.Body)
		return nil, resp.StatusCode >= 500 && resp.StatusCode <= 599, f
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1))
	if err != nil {
		return nil, false, newFailure(kind, ReasonParse, "Failed to parse response from API server: "+err.Error(), err)
	}
	if int64(len(b)) > c.cfg.MaxResponseBytes {
		return nil, false, newFailure(kind, ReasonParse, fmt.Sprintf(
			"Failed to parse response from API server: response exceeds %d bytes", c.cfg.MaxResponseBytes), nil)
	}
	return b, false, nil
}

// bodyPreview reads the start of an error body: 512 characters and "..."
// when there are more. Only enough of the body for that is read.
func bodyPreview(r io.Reader) *string {
	b, err := io.ReadAll(io.LimitReader(r, bodyPreviewChars*utf8.UTFMax+1))
	if err != nil && len(b) == 0 {
		return nil
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if utf8.RuneCountInString(s) > bodyPreviewChars {
		s = string([]rune(s)[:bodyPreviewChars]) + "..."
	}
	return &s
}

// transformCache keeps successful transforms for a short time, keyed by the
// query id and the whole request identity, as zero-cache's 5 s TimedCache.
type transformCache struct {
	ttl       time.Duration
	mu        sync.Mutex
	entries   map[string]cacheEntry
	lastSweep time.Time
}

type cacheEntry struct {
	q       QueryResult
	expires time.Time
}

func newTransformCache(ttl time.Duration) *transformCache {
	return &transformCache{ttl: ttl, entries: map[string]cacheEntry{}}
}

func (tc *transformCache) get(key string, now time.Time) (QueryResult, bool) {
	if tc.ttl < 0 {
		return QueryResult{}, false
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	e, ok := tc.entries[key]
	if !ok || !now.Before(e.expires) {
		return QueryResult{}, false
	}
	return e.q, true
}

func (tc *transformCache) set(key string, q QueryResult, now time.Time) {
	if tc.ttl < 0 {
		return
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	// Sweep at most once per TTL so the map holds about one TTL's traffic.
	if now.Sub(tc.lastSweep) >= tc.ttl {
		for k, e := range tc.entries {
			if !now.Before(e.expires) {
				delete(tc.entries, k)
			}
		}
		tc.lastSweep = now
	}
	tc.entries[key] = cacheEntry{q: q, expires: now.Add(tc.ttl)}
}

func (tc *transformCache) len() int {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return len(tc.entries)
}

func cacheKey(e effective, userID, queryID string) string {
	b, _ := json.Marshal([]any{queryID, e.token, e.cookie, e.origin, userID, e.url, e.customHeaders, e.requestHeaders})
	return string(b)
}
