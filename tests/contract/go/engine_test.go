package contract

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// engineCases is tests/contract/engine-cases.json: the rules every runner's
// engine follows, the same cases for Python, Go and TypeScript.
type engineCases struct {
	Match []struct {
		Name     string            `json:"name"`
		Expected json.RawMessage   `json:"expected"`
		Actual   json.RawMessage   `json:"actual"` // nil: the actual value is missing
		Vars     map[string]string `json:"vars"`
		OK       bool              `json:"ok"`
	} `json:"match"`
	Expand []struct {
		Name     string            `json:"name"`
		Template json.RawMessage   `json:"template"`
		Vars     map[string]string `json:"vars"`
		Result   json.RawMessage   `json:"result"`
		Error    bool              `json:"error"`
	} `json:"expand"`
	Capture []struct {
		Name     string          `json:"name"`
		Response json.RawMessage `json:"response"`
		Path     string          `json:"path"`
		Value    string          `json:"value"`
		Error    bool            `json:"error"`
	} `json:"capture"`
}

func loadEngineCases(t *testing.T) engineCases {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(contractDir, "engine-cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases engineCases
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases.Match) == 0 || len(cases.Expand) == 0 || len(cases.Capture) == 0 {
		t.Fatal("engine-cases.json has an empty section")
	}
	return cases
}

func decode(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	value, err := DecodeJSON(raw)
	if err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return value
}

func TestEngineMatch(t *testing.T) {
	for _, c := range loadEngineCases(t).Match {
		t.Run(c.Name, func(t *testing.T) {
			actual := Missing
			if c.Actual != nil {
				actual = decode(t, c.Actual)
			}
			problem := ""
			expected, err := Expand(decode(t, c.Expected), c.Vars)
			if err != nil {
				problem = err.Error()
			} else {
				problem = Mismatch(expected, actual, "")
			}
			if (problem == "") != c.OK {
				t.Errorf("want ok=%v, got problem %q", c.OK, problem)
			}
		})
	}
}

func TestEngineExpand(t *testing.T) {
	for _, c := range loadEngineCases(t).Expand {
		t.Run(c.Name, func(t *testing.T) {
			got, err := Expand(decode(t, c.Template), c.Vars)
			if c.Error {
				if err == nil {
					t.Errorf("want an error, got %v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if want := decode(t, c.Result); !reflect.DeepEqual(got, want) {
				t.Errorf("got %#v, want %#v", got, want)
			}
		})
	}
}

func TestEngineCapture(t *testing.T) {
	for _, c := range loadEngineCases(t).Capture {
		t.Run(c.Name, func(t *testing.T) {
			response, _ := decode(t, c.Response).(map[string]any)
			got, err := Capture(response, c.Path)
			if c.Error {
				if err == nil {
					t.Errorf("want an error, got %q", got)
				}
				return
			}
			if err != nil || got != c.Value {
				t.Errorf("got %q (%v), want %q", got, err, c.Value)
			}
		})
	}
}
