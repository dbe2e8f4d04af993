package appapi

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLoadEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr bool
	}{{
		name: "Unset",
		env:  map[string]string{},
		want: Config{},
	}, {
		name: "Current",
		env: map[string]string{
			"ZERO_QUERY_URL":                      "http://a/query, https://*.example.com/query",
			"ZERO_QUERY_API_KEY":                  "qk",
			"ZERO_QUERY_FORWARD_COOKIES":          "TRUE",
			"ZERO_QUERY_ALLOWED_CLIENT_HEADERS":   "x-a,x-b",
			"ZERO_QUERY_ALLOWED_REQUEST_HEADERS":  "x-forwarded-for",
			"ZERO_MUTATE_URL":                     "http://a/mutate",
			"ZERO_MUTATE_FORWARD_COOKIES":         "1",
			"ZERO_MUTATE_ALLOWED_REQUEST_HEADERS": "cf-ray",
			"ZERO_APP_ID":                         "zpeer",
			"ZERO_SHARD_NUM":                      "3",
			"ZERO_GET_QUERIES_URL":                "http://ignored/",
		},
		want: Config{
			Query: Endpoint{URLs: []string{"http://a/query", "https://*.example.com/query"}, APIKey: "qk", ForwardCookies: true,
				AllowedClientHeaders: []string{"x-a", "x-b"}, AllowedRequestHeaders: []string{"x-forwarded-for"}},
			Mutate: Endpoint{URLs: []string{"http://a/mutate"}, ForwardCookies: true, AllowedRequestHeaders: []string{"cf-ray"}},
			AppID:  "zpeer", ShardNum: 3,
		},
	}, {
		name: "DeprecatedAliases",
		env: map[string]string{
			"ZERO_GET_QUERIES_URL":             "http://old/get-queries",
			"ZERO_GET_QUERIES_API_KEY":         "gk",
			"ZERO_GET_QUERIES_FORWARD_COOKIES": "true",
			"ZERO_QUERY_API_KEY":               "not used: ZERO_QUERY_URL is unset",
			"ZERO_PUSH_URL":                    "http://old/push",
			"ZERO_PUSH_API_KEY":                "pk",
			"ZERO_PUSH_FORWARD_COOKIES":        "true",
		},
		want: Config{
			Query:  Endpoint{URLs: []string{"http://old/get-queries"}, APIKey: "gk", ForwardCookies: true},
			Mutate: Endpoint{URLs: []string{"http://old/push"}, APIKey: "pk", ForwardCookies: true},
		},
	}, {
		name: "PushURLWinsMutateFieldsWin",
		env: map[string]string{
			"ZERO_PUSH_URL":               "http://old/push",
			"ZERO_PUSH_API_KEY":           "pk",
			"ZERO_MUTATE_URL":             "http://new/mutate",
			"ZERO_MUTATE_API_KEY":         "mk",
			"ZERO_MUTATE_FORWARD_COOKIES": "false",
			"ZERO_PUSH_FORWARD_COOKIES":   "true",
		},
		want: Config{Mutate: Endpoint{URLs: []string{"http://old/push"}, APIKey: "mk", ForwardCookies: false}},
	}, {
		name:    "BadBool",
		env:     map[string]string{"ZERO_MUTATE_FORWARD_COOKIES": "yes"},
		wantErr: true,
	}, {
		name:    "BadShard",
		env:     map[string]string{"ZERO_SHARD_NUM": "x"},
		wantErr: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadEnv(func(k string) string { return tc.env[k] })
			if tc.wantErr {
				if err == nil {
					t.Fatalf("LoadEnv = %+v; want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadEnv: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("LoadEnv (-want +got):\n%s", diff)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestConfig_Validate(t *testing.T) {
	bad := []Config{
		{AppID: "Bad-App"},
		{ShardNum: -1},
		{Query: Endpoint{URLs: []string{"not-a-url"}}},
		{Mutate: Endpoint{URLs: []string{"https://x/:v(\\d+)"}}},
		{Mutate: Endpoint{URLs: []string{"https://x/m?appID=a"}}},
		{MaxAttempts: -1},
	}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v.Validate() = nil; want an error", c)
		}
	}
	if err := (Config{AppID: "zpeer", Query: Endpoint{URLs: []string{"http://127.0.0.1:*/query"}}}).Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}
