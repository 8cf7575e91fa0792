package webhook

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// secretValue is the secret's text in the tests: whoever prints it fails
// them.
var secretValue = "whsec_" + base64.StdEncoding.EncodeToString(testSecret)

func TestParseSecret(t *testing.T) {
	t.Parallel()
	plain := base64.StdEncoding.EncodeToString(testSecret)
	for _, s := range []string{secretValue, plain, "  " + secretValue + "\n", strings.TrimRight(plain, "=")} {
		key, err := ParseSecret(s)
		if err != nil || !bytes.Equal(key, testSecret) {
			t.Errorf("ParseSecret(%q) = %q, %v; want the test secret", s, key, err)
		}
	}
	for _, s := range []string{"", "whsec_", "whsec_not*base64!", "plain text secret", "whsec_===="} {
		key, err := ParseSecret(s)
		if err == nil {
			t.Errorf("ParseSecret(%q) = %q, want an error", s, key)
			continue
		}
		if s != "" && strings.Contains(err.Error(), strings.TrimPrefix(s, "whsec_")) && strings.TrimPrefix(s, "whsec_") != "" {
			t.Errorf("ParseSecret(%q): error %q repeats the secret", s, err)
		}
	}
}

func TestResolveSecretFromTheEnvironment(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"GOOD":      secretValue,
		"MALFORMED": "sk_live_this-is-not-base64-and-must-not-be-printed",
		"BLANK":     "   ",
	}
	getenv := func(k string) string { return env[k] }
	ctx := t.Context()

	key, err := ResolveSecret(ctx, SecretRef{Env: "GOOD"}, getenv, nil)
	if err != nil || !bytes.Equal(key, testSecret) {
		t.Fatalf("GOOD: %q, %v", key, err)
	}
	for _, tc := range []struct {
		ref  SecretRef
		want string
	}{
		{SecretRef{Env: "UNSET"}, "UNSET is empty or unset"},
		{SecretRef{Env: "BLANK"}, "BLANK is empty or unset"},
		{SecretRef{Env: "MALFORMED"}, "environment variable MALFORMED is neither"},
		{SecretRef{}, "no signing secret is referenced"},
		{SecretRef{Env: "GOOD", ARN: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x"}, "referenced twice"},
	} {
		_, err := ResolveSecret(ctx, tc.ref, getenv, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.ref, err, tc.want)
			continue
		}
		for _, v := range env {
			if strings.TrimSpace(v) != "" && strings.Contains(err.Error(), v) {
				t.Errorf("%+v: error %q prints a secret", tc.ref, err)
			}
		}
	}
}

// secretsManagerFake speaks Secrets Manager's JSON 1.1 protocol: POST /,
// X-Amz-Target: secretsmanager.GetSecretValue.
type secretsManagerFake struct {
	secrets map[string]map[string]any // SecretId → GetSecretValue output fields
	calls   atomic.Int64
}

func (f *secretsManagerFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	if r.Header.Get("X-Amz-Target") != "secretsmanager.GetSecretValue" || !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"InvalidRequestException","message":"unexpected request"}`))
		return
	}
	var in struct{ SecretId string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"SerializationException","message":"bad body"}`))
		return
	}
	if in.SecretId == "arn:aws:secretsmanager:eu-west-1:123456789012:secret:forbidden" {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"AccessDeniedException","message":"User is not authorized to perform: secretsmanager:GetSecretValue"}`))
		return
	}
	out, ok := f.secrets[in.SecretId]
	if !ok {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"__type":"ResourceNotFoundException","message":"Secrets Manager can't find the specified secret."}`))
		return
	}
	body := map[string]any{"ARN": in.SecretId, "Name": "webhook", "VersionId": "v1", "VersionStages": []string{"AWSCURRENT"}}
	for k, v := range out {
		body[k] = v
	}
	_ = json.NewEncoder(w).Encode(body)
}

func TestResolveSecretFromSecretsManager(t *testing.T) {
	t.Parallel()
	const arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:"
	fake := &secretsManagerFake{secrets: map[string]map[string]any{
		arn + "string":       {"SecretString": secretValue},
		arn + "binary":       {"SecretBinary": base64.StdEncoding.EncodeToString(testSecret)},
		arn + "json":         {"SecretString": `{"signing_secret":"` + secretValue + `","other":"x"}`},
		arn + "json-number":  {"SecretString": `{"signing_secret":42}`},
		arn + "broken-json":  {"SecretString": `{"signing_secret": hunter2`},
		arn + "not-a-secret": {"SecretString": "hunter2 is my password"},
	}}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	client := secretsmanager.NewFromConfig(aws.Config{
		Region:       "eu-west-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTEST", "test", ""),
		BaseEndpoint: aws.String(srv.URL),
		Retryer:      func() aws.Retryer { return aws.NopRetryer{} },
	})
	ctx := t.Context()

	for _, ref := range []SecretRef{
		{ARN: arn + "string"},
		{ARN: arn + "binary"},
		{ARN: arn + "json", Field: "signing_secret"},
	} {
		key, err := ResolveSecret(ctx, ref, nil, client)
		if err != nil || !bytes.Equal(key, testSecret) {
			t.Errorf("%+v: %q, %v; want the test secret", ref, key, err)
		}
	}
	for _, tc := range []struct {
		ref  SecretRef
		want string
	}{
		{SecretRef{ARN: arn + "missing"}, "ResourceNotFoundException"},
		{SecretRef{ARN: arn + "forbidden"}, "AccessDeniedException"},
		{SecretRef{ARN: arn + "json"}, "holds a JSON object; name the field"},
		{SecretRef{ARN: arn + "json", Field: "nope"}, `has no field "nope"`},
		{SecretRef{ARN: arn + "json-number", Field: "signing_secret"}, "is not a non-empty string"},
		{SecretRef{ARN: arn + "broken-json", Field: "signing_secret"}, "is not one (bad JSON at byte"},
		{SecretRef{ARN: arn + "not-a-secret"}, "is neither"},
		{SecretRef{ARN: arn + "string", Field: "signing_secret"}, "is not a JSON object"},
	} {
		_, err := ResolveSecret(ctx, tc.ref, nil, client)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.ref, err, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.ref.ARN) {
			t.Errorf("%+v: error %q does not name the ARN", tc.ref, err)
		}
		for _, leak := range []string{secretValue, "hunter2", base64.StdEncoding.EncodeToString(testSecret)} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%+v: error %q prints the secret", tc.ref, err)
			}
		}
	}
	if _, err := ResolveSecret(ctx, SecretRef{ARN: arn + "string"}, nil, nil); err == nil || !strings.Contains(err.Error(), "no Secrets Manager client") {
		t.Errorf("without a client: %v", err)
	}
	if fake.calls.Load() == 0 {
		t.Error("the fake saw no calls")
	}
}
