// Package contract is the Go runner's scenario engine: scenario shape,
// variables, $repeat, matching and captures, exactly as
// tests/contract/README.md defines them (engine-cases.json pins the rules,
// and the Python and TypeScript runners pass the same cases).
//
// JSON values are what encoding/json decodes with UseNumber: map[string]any,
// []any, string, json.Number, bool and nil. Nothing here speaks gRPC: the
// runner hands in a function that makes one call.
package contract

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrorDomain is the domain of every ErrorInfo the sidecar sends.
const ErrorDomain = "psych.sidecar.v1"

// CallTimeout is every call's deadline.
const CallTimeout = 10 * time.Second

var (
	variableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	reference    = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	index        = regexp.MustCompile(`^[0-9]+$`)
)

// missingValue stands for a value absent from the actual JSON (proto3 JSON
// omits default values).
type missingValue struct{}

// Missing is the absent value.
var Missing any = missingValue{}

// ErrorDetail is one detail of a failed call's google.rpc.Status when it is
// an ErrorInfo; a nil *ErrorDetail stands for a detail of another type.
type ErrorDetail struct {
	Reason   string
	Domain   string
	Metadata map[string]string
}

// Outcome is what one call answered: a response as proto3 JSON, or a status
// code name and details.
type Outcome struct {
	Response map[string]any // nil when the call failed
	Code     string
	Message  string
	Details  []*ErrorDetail
}

// Invoke makes one call. An error means the step could not be made at all
// (an unknown method, a request the codec refuses).
type Invoke func(call string, request map[string]any) (Outcome, error)

// Scenario is one scenario file, its shape checked.
type Scenario struct {
	Name  string
	RPC   string
	Steps []map[string]any
}

// ScenarioFiles lists tests/contract/scenarios/*.json, sorted.
func ScenarioFiles(contractDir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(contractDir, "scenarios", "*.json"))
	sort.Strings(files)
	return files, err
}

// DecodeJSON decodes one JSON document with numbers kept as json.Number.
func DecodeJSON(data []byte) (any, error) {
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	var value any
	if err := decoder.Decode(&value); err != nil {
		return nil, err
	}
	if _, err := decoder.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return value, nil
}

// LoadScenario reads one scenario and checks its shape; a key this engine
// does not know fails it.
func LoadScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	file := filepath.Base(path)
	decoded, err := DecodeJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	top, ok := decoded.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: not a JSON object", file)
	}
	if err := requireKeys(top, []string{"name", "rpc", "description", "steps"}, nil, file); err != nil {
		return nil, err
	}
	name, _ := top["name"].(string)
	if name != strings.TrimSuffix(file, ".json") {
		return nil, fmt.Errorf("%s: name is not the file name", file)
	}
	rpc, ok := top["rpc"].(string)
	if !ok {
		return nil, fmt.Errorf("%s: rpc is not a string", file)
	}
	if _, ok := top["description"].(string); !ok {
		return nil, fmt.Errorf("%s: description is not a string", file)
	}
	rawSteps, ok := top["steps"].([]any)
	if !ok || len(rawSteps) == 0 {
		return nil, fmt.Errorf("%s: steps must be a non-empty list", file)
	}
	scenario := &Scenario{Name: name, RPC: rpc}
	for i, raw := range rawSteps {
		where := fmt.Sprintf("%s step %d", file, i+1)
		step, ok := raw.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: not an object", where)
		}
		if err := checkStep(step, where); err != nil {
			return nil, err
		}
		scenario.Steps = append(scenario.Steps, step)
	}
	return scenario, nil
}

func checkStep(step map[string]any, where string) error {
	if err := requireKeys(step, []string{"call", "request"}, []string{"response", "error", "capture"}, where); err != nil {
		return err
	}
	if _, ok := step["call"].(string); !ok {
		return fmt.Errorf("%s: call is not a string", where)
	}
	if _, ok := step["request"].(map[string]any); !ok {
		return fmt.Errorf("%s: request is not an object", where)
	}
	_, hasResponse := step["response"]
	_, hasError := step["error"]
	if hasResponse == hasError {
		return fmt.Errorf("%s: needs one of response, error", where)
	}
	if hasResponse {
		if _, ok := step["response"].(map[string]any); !ok {
			return fmt.Errorf("%s: response is not an object", where)
		}
	}
	if hasError {
		expected, ok := step["error"].(map[string]any)
		if !ok {
			return fmt.Errorf("%s: error is not an object", where)
		}
		if err := requireKeys(expected, []string{"code", "reason"}, []string{"metadata"}, where); err != nil {
			return err
		}
		if _, ok := expected["code"].(string); !ok {
			return fmt.Errorf("%s: error.code is not a string", where)
		}
		if _, ok := expected["reason"].(string); !ok {
			return fmt.Errorf("%s: error.reason is not a string", where)
		}
		if metadata, present := expected["metadata"]; present {
			if _, ok := metadata.(map[string]any); !ok {
				return fmt.Errorf("%s: error.metadata is not an object", where)
			}
		}
	}
	if rawCaptures, present := step["capture"]; present {
		if !hasResponse {
			return fmt.Errorf("%s: capture needs a response", where)
		}
		captures, ok := rawCaptures.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: capture is not an object", where)
		}
		for name, path := range captures {
			if !variableName.MatchString(name) {
				return fmt.Errorf("%s: variable name %q", where, name)
			}
			if _, ok := path.(string); !ok {
				return fmt.Errorf("%s: capture path of %s", where, name)
			}
		}
	}
	return nil
}

func requireKeys(object map[string]any, required, optional []string, where string) error {
	allowed := map[string]bool{}
	for _, key := range append(append([]string{}, required...), optional...) {
		allowed[key] = true
	}
	var unknown []string
	for key := range object {
		if !allowed[key] {
			unknown = append(unknown, key)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("%s: unknown keys %v", where, unknown)
	}
	for _, key := range required {
		if _, ok := object[key]; !ok {
			return fmt.Errorf("%s: missing key %s", where, key)
		}
	}
	return nil
}

// RunScenario runs every step in order and returns an error at the first
// that does not hold.
func RunScenario(scenario *Scenario, invoke Invoke) error {
	unique := make([]byte, 6)
	if _, err := rand.Read(unique); err != nil {
		return err
	}
	variables := map[string]string{"unique": hex.EncodeToString(unique)}
	// scripts/test-contract starts the OAuth test server of the sign-in scenarios.
	if url := os.Getenv("PSYCH_CONTRACT_OAUTH_MCP_URL"); url != "" {
		variables["oauth_mcp_url"] = url
	}
	for i, step := range scenario.Steps {
		if err := runStep(step, variables, invoke); err != nil {
			return fmt.Errorf("%s: step %d (%s): %w", scenario.Name, i+1, step["call"], err)
		}
	}
	return nil
}

func runStep(step map[string]any, variables map[string]string, invoke Invoke) error {
	request, err := Expand(step["request"], variables)
	if err != nil {
		return err
	}
	outcome, err := invoke(step["call"].(string), request.(map[string]any))
	if err != nil {
		return err
	}
	if rawError, ok := step["error"]; ok {
		expected, err := Expand(rawError, variables)
		if err != nil {
			return err
		}
		return checkError(expected.(map[string]any), outcome)
	}
	expected, err := Expand(step["response"], variables)
	if err != nil {
		return err
	}
	if outcome.Response == nil {
		return fmt.Errorf("expected a response, got %s: %s %s", outcome.Code, outcome.Message, describeDetails(outcome.Details))
	}
	if problem := Mismatch(expected, outcome.Response, ""); problem != "" {
		return fmt.Errorf("%s; the response: %s", problem, show(outcome.Response, 2000))
	}
	captures, _ := step["capture"].(map[string]any)
	names := make([]string, 0, len(captures))
	for name := range captures {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, defined := variables[name]; defined {
			return fmt.Errorf("variable %s is already defined", name)
		}
		value, err := Capture(outcome.Response, captures[name].(string))
		if err != nil {
			return err
		}
		variables[name] = value
	}
	return nil
}

func checkError(expected map[string]any, outcome Outcome) error {
	code, reason := expected["code"].(string), expected["reason"].(string)
	if outcome.Response != nil {
		return fmt.Errorf("expected %s / %s, got a response %s", code, reason, show(outcome.Response, 2000))
	}
	got := fmt.Sprintf("%s %q with details %s", outcome.Code, outcome.Message, describeDetails(outcome.Details))
	if outcome.Code != code {
		return fmt.Errorf("expected status %s, got %s", code, got)
	}
	if len(outcome.Details) != 1 || outcome.Details[0] == nil {
		return fmt.Errorf("expected exactly one detail, an ErrorInfo; got %s", got)
	}
	info := outcome.Details[0]
	if info.Domain != ErrorDomain {
		return fmt.Errorf("expected ErrorInfo domain %s, got %s", ErrorDomain, got)
	}
	if info.Reason != reason {
		return fmt.Errorf("expected reason %s, got %s", reason, got)
	}
	expectedMetadata, ok := expected["metadata"]
	if !ok {
		expectedMetadata = map[string]any{}
	}
	actualMetadata := map[string]any{}
	for key, value := range info.Metadata {
		actualMetadata[key] = value
	}
	if problem := Mismatch(expectedMetadata, actualMetadata, "metadata"); problem != "" {
		return fmt.Errorf("%s; got %s", problem, got)
	}
	return nil
}

func describeDetails(details []*ErrorDetail) string {
	parts := make([]string, len(details))
	for i, detail := range details {
		if detail == nil {
			parts[i] = "<not an ErrorInfo>"
		} else {
			parts[i] = fmt.Sprintf("ErrorInfo{reason=%s domain=%s metadata=%v}", detail.Reason, detail.Domain, detail.Metadata)
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Substitute replaces each ${name} by the variable's value; a malformed or
// unknown reference is an error.
func Substitute(text string, variables map[string]string) (string, error) {
	var out strings.Builder
	rest := text
	for {
		start := strings.Index(rest, "${")
		if start < 0 {
			out.WriteString(rest)
			return out.String(), nil
		}
		match := reference.FindStringSubmatch(rest[start:])
		if match == nil {
			return "", fmt.Errorf("malformed variable reference in %s", show(text, 200))
		}
		value, ok := variables[match[1]]
		if !ok {
			return "", fmt.Errorf("undefined variable ${%s}", match[1])
		}
		out.WriteString(rest[:start])
		out.WriteString(value)
		rest = rest[start+len(match[0]):]
	}
}

// Expand substitutes variables in every string (not in keys) and replaces
// each {"$repeat": [text, count]}.
func Expand(value any, variables map[string]string) (any, error) {
	switch v := value.(type) {
	case string:
		return Substitute(v, variables)
	case []any:
		out := make([]any, len(v))
		for i, item := range v {
			expanded, err := Expand(item, variables)
			if err != nil {
				return nil, err
			}
			out[i] = expanded
		}
		return out, nil
	case map[string]any:
		if _, ok := v["$repeat"]; ok {
			return repeat(v, variables)
		}
		out := make(map[string]any, len(v))
		for key, item := range v {
			expanded, err := Expand(item, variables)
			if err != nil {
				return nil, err
			}
			out[key] = expanded
		}
		return out, nil
	default:
		return value, nil
	}
}

func repeat(value map[string]any, variables map[string]string) (any, error) {
	arguments, ok := value["$repeat"].([]any)
	bad := fmt.Errorf(`$repeat takes ["text", count >= 0] and nothing beside it: %s`, show(value, 200))
	if len(value) != 1 || !ok || len(arguments) != 2 {
		return nil, bad
	}
	text, isString := arguments[0].(string)
	count, isCount := countOf(arguments[1])
	if !isString || !isCount {
		return nil, bad
	}
	expanded, err := Substitute(text, variables)
	if err != nil {
		return nil, err
	}
	return strings.Repeat(expanded, count), nil
}

// Mismatch says why actual does not match expected, or "" when it does
// (README.md, Matching).
func Mismatch(expected, actual any, path string) string {
	where := path
	if where == "" {
		where = "<response>"
	}
	if object, ok := expected.(map[string]any); ok && hasMatcherKey(object) {
		return matcherMismatch(object, actual, where)
	}
	if actual == Missing {
		return fmt.Sprintf("%s: missing, expected %s", where, show(expected, 200))
	}
	switch e := expected.(type) {
	case map[string]any:
		a, ok := actual.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: expected an object, got %s", where, show(actual, 200))
		}
		keys := make([]string, 0, len(e))
		for key := range e {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			found, present := a[key]
			if !present {
				found = Missing
			}
			if problem := Mismatch(e[key], found, join(path, key)); problem != "" {
				return problem
			}
		}
		return ""
	case []any:
		a, ok := actual.([]any)
		if !ok || len(a) != len(e) {
			return fmt.Sprintf("%s: expected a list of %d, got %s", where, len(e), show(actual, 200))
		}
		for i := range e {
			if problem := Mismatch(e[i], a[i], join(path, strconv.Itoa(i))); problem != "" {
				return problem
			}
		}
		return ""
	}
	if sameLiteral(expected, actual) {
		return ""
	}
	return fmt.Sprintf("%s: expected %s, got %s", where, show(expected, 200), show(actual, 200))
}

func sameLiteral(expected, actual any) bool {
	switch e := expected.(type) {
	case nil:
		return actual == nil
	case bool:
		a, ok := actual.(bool)
		return ok && a == e
	case json.Number:
		a, ok := actual.(json.Number)
		if !ok {
			return false
		}
		ef, errE := e.Float64()
		af, errA := a.Float64()
		return errE == nil && errA == nil && ef == af
	case string:
		a, ok := actual.(string)
		return ok && a == e
	}
	return false
}

func hasMatcherKey(object map[string]any) bool {
	for key := range object {
		if strings.HasPrefix(key, "$") {
			return true
		}
	}
	return false
}

func matcherMismatch(expected map[string]any, actual any, where string) string {
	if len(expected) != 1 {
		return fmt.Sprintf("%s: a matcher must be the only key of its object: %s", where, show(expected, 200))
	}
	for name, argument := range expected {
		switch {
		case name == "$present" && argument == true:
			if actual == Missing {
				return fmt.Sprintf("%s: missing, expected present", where)
			}
			return ""
		case name == "$absent" && argument == true:
			if actual != Missing {
				return fmt.Sprintf("%s: expected absent, got %s", where, show(actual, 200))
			}
			return ""
		case name == "$len":
			count, ok := countOf(argument)
			if !ok {
				break
			}
			length := -1
			if actual == Missing {
				length = 0
			} else if list, isList := actual.([]any); isList {
				length = len(list)
			}
			if length == count {
				return ""
			}
			return fmt.Sprintf("%s: expected a list of %d, got %s", where, count, show(actual, 200))
		}
	}
	return fmt.Sprintf("%s: unknown matcher %s", where, show(expected, 200))
}

// Capture returns the string at a dotted path of the response; a decimal
// segment indexes a list.
func Capture(response map[string]any, path string) (string, error) {
	var value any = response
	for _, segment := range strings.Split(path, ".") {
		switch v := value.(type) {
		case []any:
			i, err := strconv.Atoi(segment)
			if !index.MatchString(segment) || err != nil || i >= len(v) {
				return "", fmt.Errorf("capture %q: nothing at %q", path, segment)
			}
			value = v[i]
		case map[string]any:
			found, ok := v[segment]
			if !ok {
				return "", fmt.Errorf("capture %q: nothing at %q", path, segment)
			}
			value = found
		default:
			return "", fmt.Errorf("capture %q: nothing at %q", path, segment)
		}
	}
	text, ok := value.(string)
	if !ok {
		return "", fmt.Errorf("capture %q: %s is not a string", path, show(value, 200))
	}
	return text, nil
}

func countOf(value any) (int, bool) {
	number, ok := value.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := number.Float64()
	if err != nil || f < 0 || f != math.Trunc(f) {
		return 0, false
	}
	return int(f), true
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func show(value any, limit int) string {
	if value == Missing {
		return "<missing>"
	}
	data, err := json.Marshal(value)
	if err != nil {
		return fmt.Sprintf("%v", value)
	}
	if len(data) > limit {
		return string(data[:limit]) + "…"
	}
	return string(data)
}
