package appapi

import (
	"fmt"
	"strconv"
	"strings"
)

// Setting describes one environment variable LoadEnv reads.
type Setting struct {
	Name, Meaning string
}

// Settings lists the environment variables LoadEnv reads, for usage text.
var Settings = []Setting{
	{"ZERO_QUERY_URL", "comma-separated URL patterns of the synced-query endpoint; the first is the default URL, a client's queryURL must match one"},
	{"ZERO_QUERY_API_KEY", "sent to the query endpoint as X-Api-Key"},
	{"ZERO_QUERY_FORWARD_COOKIES", "true|1|false|0: forward the websocket upgrade request's Cookie header to the query endpoint"},
	{"ZERO_QUERY_ALLOWED_CLIENT_HEADERS", "comma-separated header names the client's queryHeaders may set"},
	{"ZERO_QUERY_ALLOWED_REQUEST_HEADERS", "comma-separated header names copied from the upgrade request to the query endpoint"},
	{"ZERO_GET_QUERIES_URL", "deprecated alias section: ZERO_GET_QUERIES_{URL,API_KEY,FORWARD_COOKIES,ALLOWED_CLIENT_HEADERS,ALLOWED_REQUEST_HEADERS} are used, all together, when ZERO_QUERY_URL is unset"},
	{"ZERO_MUTATE_URL", "comma-separated URL patterns of the custom-mutator endpoint; the first is the default URL, a client's mutateURL must match one"},
	{"ZERO_MUTATE_API_KEY", "sent to the mutate endpoint as X-Api-Key"},
	{"ZERO_MUTATE_FORWARD_COOKIES", "true|1|false|0: forward the upgrade request's Cookie header to the mutate endpoint"},
	{"ZERO_MUTATE_ALLOWED_CLIENT_HEADERS", "comma-separated header names the client's mutateHeaders may set"},
	{"ZERO_MUTATE_ALLOWED_REQUEST_HEADERS", "comma-separated header names copied from the upgrade request to the mutate endpoint"},
	{"ZERO_PUSH_URL", "deprecated alias of ZERO_MUTATE_URL, which it overrides when both are set (as zero-cache does); ZERO_PUSH_{API_KEY,FORWARD_COOKIES,ALLOWED_CLIENT_HEADERS,ALLOWED_REQUEST_HEADERS} fill in what ZERO_MUTATE_* leaves unset"},
	{"ZERO_APP_ID", "app ID (default zero); requests carry ?schema=<app>_<shard>&appID=<app>"},
	{"ZERO_SHARD_NUM", "shard number (default 0)"},
}

// LoadEnv reads the API-server settings through getenv (os.Getenv), with
// zero-cache's rules: an empty value is unset, lists are comma-separated
// (entries are trimmed here, which zero-cache does not do), booleans are
// true/1/false/0. The aliases resolve as in zero-cache's syncer:
//
//   - query: the ZERO_QUERY_* section when ZERO_QUERY_URL is set, else the
//     whole ZERO_GET_QUERIES_* section;
//   - mutate: the URL is ZERO_PUSH_URL, else ZERO_MUTATE_URL; every other
//     field is ZERO_MUTATE_* when set, else ZERO_PUSH_*. (zero-cache merges
//     the two sections so that ZERO_MUTATE_FORWARD_COOKIES's default false
//     hides ZERO_PUSH_FORWARD_COOKIES=true; here the alias still works.)
//
// The result still needs Validate (New does it).
func LoadEnv(getenv func(string) string) (Config, error) {
	var cfg Config
	section := func(prefix string) (Endpoint, map[string]bool, error) {
		set := map[string]bool{}
		var e Endpoint
		get := func(k string) string {
			v := getenv(prefix + k)
			if v != "" {
				set[k] = true
			}
			return v
		}
		e.URLs = SplitList(get("URL"))
		e.APIKey = get("API_KEY")
		if v := get("FORWARD_COOKIES"); v != "" {
			b, err := parseBool(v)
			if err != nil {
				return e, nil, fmt.Errorf("%sFORWARD_COOKIES: %w", prefix, err)
			}
			e.ForwardCookies = b
		}
		e.AllowedClientHeaders = SplitList(get("ALLOWED_CLIENT_HEADERS"))
		e.AllowedRequestHeaders = SplitList(get("ALLOWED_REQUEST_HEADERS"))
		return e, set, nil
	}
	query, _, err := section("ZERO_QUERY_")
	if err != nil {
		return cfg, err
	}
	getQueries, _, err := section("ZERO_GET_QUERIES_")
	if err != nil {
		return cfg, err
	}
	cfg.Query = query
	if !query.Configured() {
		cfg.Query = getQueries
	}
	if !cfg.Query.Configured() {
		cfg.Query = Endpoint{}
	}
	mutate, mset, err := section("ZERO_MUTATE_")
	if err != nil {
		return cfg, err
	}
	push, _, err := section("ZERO_PUSH_")
	if err != nil {
		return cfg, err
	}
	m := push
	if !push.Configured() {
		m.URLs = mutate.URLs
	}
	if mset["API_KEY"] {
		m.APIKey = mutate.APIKey
	}
	if mset["FORWARD_COOKIES"] {
		m.ForwardCookies = mutate.ForwardCookies
	}
	if mset["ALLOWED_CLIENT_HEADERS"] {
		m.AllowedClientHeaders = mutate.AllowedClientHeaders
	}
	if mset["ALLOWED_REQUEST_HEADERS"] {
		m.AllowedRequestHeaders = mutate.AllowedRequestHeaders
	}
	if !m.Configured() {
		// Without a URL nothing else matters; keep the section empty.
		m = Endpoint{}
	}
	cfg.Mutate = m
	cfg.AppID = getenv("ZERO_APP_ID")
	if v := getenv("ZERO_SHARD_NUM"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return cfg, fmt.Errorf("ZERO_SHARD_NUM: %w", err)
		}
		cfg.ShardNum = n
	}
	return cfg, nil
}

// SplitList splits a comma-separated setting, trimming each item and
// dropping empty ones.
func SplitList(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(s) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, fmt.Errorf("invalid boolean %q", s)
}
