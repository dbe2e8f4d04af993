package viewsyncer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// transcriptFrames returns every client frame of the transcripts, the
// header initConnection messages included.
func transcriptFrames(f *testing.F) [][]byte {
	f.Helper()
	files, err := filepath.Glob(filepath.Join(transcriptDir, "*.jsonl"))
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var r record
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			switch {
			case r.Dir == "up":
				out = append(out, r.Msg)
			case r.Dir == "open":
				var sp secProtocol
				if json.Unmarshal(r.SecProtocol, &sp) == nil && len(sp.InitConnectionMessage) > 0 {
					out = append(out, sp.InitConnectionMessage)
				}
			}
		}
	}
	return out
}

// encodeUpstream re-encodes what decodeUpstream kept of a frame.
func encodeUpstream(u *upstream) []byte {
	var body any = struct{}{}
	switch {
	case u.InitConnection != nil:
		body = u.InitConnection
	case u.ChangeDesiredQueries != nil:
		body = u.ChangeDesiredQueries
	case u.DeleteClients != nil:
		body = u.DeleteClients
	case u.UpdateAuth != nil:
		body = u.UpdateAuth
	}
	b, err := json.Marshal([]any{u.Tag, body})
	if err != nil {
		return nil
	}
	return b
}

func FuzzClientFrame(f *testing.F) {
	for _, b := range transcriptFrames(f) {
		f.Add(b)
	}
	for _, s := range []string{`["ping",{}]`, `["closeConnection",[]]`, `["deleteClients",{"clientIDs":["a"]}]`, `["updateAuth",{"auth":"x"}]`, `[]`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := decodeUpstream(b)
		if err != nil {
			return
		}
		// What was kept survives a round trip.
		once := encodeUpstream(u)
		u2, err := decodeUpstream(once)
		if err != nil {
			t.Fatalf("re-decode %s: %v", once, err)
		}
		if twice := encodeUpstream(u2); !bytes.Equal(once, twice) {
			t.Fatalf("round trip:\n%s\n%s", once, twice)
		}
	})
}

func FuzzSecProtocol(f *testing.F) {
	for _, b := range transcriptFrames(f) {
		if s, err := encodeSecProtocol(secProtocol{InitConnectionMessage: b, AuthToken: "t"}); err == nil {
			f.Add(s)
		}
	}
	f.Add("e30%3D")
	f.Fuzz(func(t *testing.T, s string) {
		sp, init, err := decodeSecProtocol(s)
		if err != nil {
			return
		}
		if sp == nil {
			t.Fatal("nil secProtocol without an error")
		}
		if init != nil && init.DesiredQueriesPatch == nil {
			t.Fatal("initConnection without desiredQueriesPatch")
		}
	})
}

func TestDecodeSecProtocol(t *testing.T) {
	sp, init, err := decodeSecProtocol("e30%3D")
	if err != nil || sp.AuthToken != "" || init != nil {
		t.Errorf(`decodeSecProtocol("e30%%3D") = %+v, %+v, %v; want empty`, sp, init, err)
	}
	enc, err := encodeSecProtocol(secProtocol{AuthToken: "tok", InitConnectionMessage: json.RawMessage(`["initConnection",{"desiredQueriesPatch":[]}]`)})
	if err != nil {
		t.Fatal(err)
	}
	sp, init, err = decodeSecProtocol(enc)
	if err != nil || sp.AuthToken != "tok" || init == nil || len(init.DesiredQueriesPatch) != 0 {
		t.Errorf("decodeSecProtocol(%s) = %+v, %+v, %v", enc, sp, init, err)
	}
	for _, bad := range []string{"%zz", "!!!", "bnVsbA%3D%3D" /* null */, "WyJwaW5nIix7fV0%3D" /* an array */} {
		if _, _, err := decodeSecProtocol(bad); err == nil {
			t.Errorf("decodeSecProtocol(%q) succeeded", bad)
		}
	}
}
