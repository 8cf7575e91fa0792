package webhook

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// secretPrefix marks a Standard Webhooks secret: "whsec_" and the key in
// standard base64.
const secretPrefix = "whsec_"

// ParseSecret decodes a signing secret written as "whsec_<base64>" (the
// Standard Webhooks format) or as plain base64 into the raw key. Its errors
// never include s.
func ParseSecret(s string) ([]byte, error) {
	key, err := parseSecret(s)
	if err != nil {
		return nil, fmt.Errorf("webhook: the signing secret is %w", err)
	}
	return key, nil
}

func parseSecret(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	encoded, prefixed := strings.CutPrefix(s, secretPrefix)
	if encoded == "" {
		return nil, errors.New("empty")
	}
	key, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		// Some tools strip the padding; accept that too.
		if k, rawErr := base64.RawStdEncoding.DecodeString(encoded); rawErr == nil {
			key, err = k, nil
		}
	}
	if err != nil {
		at := ""
		var corrupt base64.CorruptInputError
		if errors.As(err, &corrupt) {
			at = fmt.Sprintf(" (bad input at byte %d)", int64(corrupt)+int64(len(s)-len(encoded)))
		}
		if prefixed {
			return nil, fmt.Errorf("prefixed with %q but the rest is not base64%s", secretPrefix, at)
		}
		return nil, fmt.Errorf("neither %q followed by base64 nor base64%s", secretPrefix+"…", at)
	}
	if len(key) == 0 {
		return nil, errors.New("the base64 of no bytes")
	}
	return key, nil
}

// SecretRef says where a route's signing secret lives (secrets are
// referenced, never inline). Exactly one of Env and ARN is set.
type SecretRef struct {
	// Env names an environment variable holding the secret.
	Env string
	// ARN is a Secrets Manager secret (ARN or name) holding it.
	ARN string
	// Field is, when the secret's string is a JSON object (the console's
	// key/value form), the field that holds the signing secret.
	Field string
}

// SecretsManagerAPI is the part of the Secrets Manager client ResolveSecret
// uses; *secretsmanager.Client implements it.
type SecretsManagerAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// ResolveSecret reads the signing secret ref names, once per cold start:
// from getenv(ref.Env), or from Secrets Manager. A secret string is parsed
// with ParseSecret ("whsec_…" or base64); a binary secret is the raw key.
// Errors name the variable or the ARN, never the secret's value.
func ResolveSecret(ctx context.Context, ref SecretRef, getenv func(string) string, sm SecretsManagerAPI) ([]byte, error) {
	switch {
	case ref.Env != "" && ref.ARN != "":
		return nil, fmt.Errorf("webhook: the signing secret is referenced twice (environment variable %s and Secrets Manager %s); set one", ref.Env, ref.ARN)
	case ref.Env != "":
		if getenv == nil {
			return nil, fmt.Errorf("webhook: signing secret %s: no environment to read it from", ref.Env)
		}
		value := getenv(ref.Env)
		if strings.TrimSpace(value) == "" {
			return nil, fmt.Errorf("webhook: the signing secret's environment variable %s is empty or unset", ref.Env)
		}
		key, err := parseSecret(value)
		if err != nil {
			return nil, fmt.Errorf("webhook: the signing secret in environment variable %s is %w", ref.Env, err)
		}
		return key, nil
	case ref.ARN != "":
		return resolveFromSecretsManager(ctx, ref, sm)
	}
	return nil, errors.New("webhook: no signing secret is referenced (set an environment variable name or a Secrets Manager ARN)")
}

func resolveFromSecretsManager(ctx context.Context, ref SecretRef, sm SecretsManagerAPI) ([]byte, error) {
	if sm == nil {
		return nil, fmt.Errorf("webhook: signing secret %s: no Secrets Manager client", ref.ARN)
	}
	out, err := sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &ref.ARN})
	if err != nil {
		// The SDK's error names the operation, the status and the request
		// id; it never carries a secret value.
		return nil, fmt.Errorf("webhook: read signing secret %s from Secrets Manager: %w", ref.ARN, err)
	}
	if out.SecretString == nil {
		if len(out.SecretBinary) == 0 {
			return nil, fmt.Errorf("webhook: Secrets Manager secret %s has no value", ref.ARN)
		}
		return out.SecretBinary, nil
	}
	value := *out.SecretString
	if trimmed := strings.TrimSpace(value); strings.HasPrefix(trimmed, "{") {
		if ref.Field == "" {
			return nil, fmt.Errorf("webhook: Secrets Manager secret %s holds a JSON object; name the field that holds the signing secret", ref.ARN)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(trimmed), &fields); err != nil {
			// Not %w: a json.SyntaxError quotes the offending character.
			at := ""
			var syntaxErr *json.SyntaxError
			if errors.As(err, &syntaxErr) {
				at = fmt.Sprintf(" (bad JSON at byte %d)", syntaxErr.Offset)
			}
			return nil, fmt.Errorf("webhook: Secrets Manager secret %s starts like a JSON object but is not one%s", ref.ARN, at)
		}
		raw, ok := fields[ref.Field]
		if !ok {
			return nil, fmt.Errorf("webhook: Secrets Manager secret %s has no field %q", ref.ARN, ref.Field)
		}
		if err := json.Unmarshal(raw, &value); err != nil || value == "" {
			return nil, fmt.Errorf("webhook: field %q of Secrets Manager secret %s is not a non-empty string", ref.Field, ref.ARN)
		}
	} else if ref.Field != "" {
		return nil, fmt.Errorf("webhook: Secrets Manager secret %s is not a JSON object, so it has no field %q", ref.ARN, ref.Field)
	}
	key, err := parseSecret(value)
	if err != nil {
		return nil, fmt.Errorf("webhook: the signing secret in Secrets Manager secret %s is %w", ref.ARN, err)
	}
	return key, nil
}
