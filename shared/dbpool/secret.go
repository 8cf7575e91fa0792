package dbpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// rdsSecret is the JSON document that RDS, and the rotation functions AWS
// provides, keep in a database secret. An RDS-managed master user secret
// holds only username and password; host, port and dbname then come from
// Config.Host, Port and Database.
type rdsSecret struct {
	Username string
	Password string
	Engine   string
	Host     string
	Port     uint16
	DBName   string
	// VersionID is Secrets Manager's version of the secret: not secret, and
	// what an operator compares to see whether a rotation has landed.
	VersionID string
}

// postgresEngines are the engine values of a PostgreSQL RDS secret.
var postgresEngines = []string{"postgres", "postgresql", "aurora-postgresql"}

// parseRDSSecret reads the RDS secret JSON. Its errors name fields and JSON
// types, never a value: a value may be the password.
func parseRDSSecret(secretString string) (rdsSecret, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(secretString), &fields); err != nil {
		var syntaxErr *json.SyntaxError
		if errors.As(err, &syntaxErr) {
			return rdsSecret{}, fmt.Errorf("the secret value is not JSON (syntax error at byte %d); expected the RDS secret format {\"username\",\"password\",\"host\",\"port\",\"dbname\"}", syntaxErr.Offset)
		}
		return rdsSecret{}, errors.New("the secret value is not a JSON object; expected the RDS secret format {\"username\",\"password\",\"host\",\"port\",\"dbname\"}")
	}
	var (
		s        rdsSecret
		problems []string
	)
	str := func(key string, dst *string) {
		raw, ok := fields[key]
		if !ok || string(raw) == "null" {
			return
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			problems = append(problems, fmt.Sprintf("%q must be a string", key))
		}
	}
	str("username", &s.Username)
	str("password", &s.Password)
	str("engine", &s.Engine)
	str("host", &s.Host)
	str("dbname", &s.DBName)
	if raw, ok := fields["port"]; ok && string(raw) != "null" {
		// RDS writes the port as a number; hand-made secrets often quote it.
		var n json.Number
		var text string
		if json.Unmarshal(raw, &n) == nil {
			text = n.String()
		} else if json.Unmarshal(raw, &text) != nil {
			text = ""
		}
		port, err := strconv.ParseUint(text, 10, 16)
		if err != nil || port == 0 {
			problems = append(problems, `"port" must be a port number`)
		}
		s.Port = uint16(port)
	}
	var missing []string
	if s.Username == "" {
		missing = append(missing, `"username"`)
	}
	if s.Password == "" {
		missing = append(missing, `"password"`)
	}
	if len(missing) > 0 {
		problems = append(problems, "missing "+strings.Join(missing, " and "))
	}
	if s.Engine != "" && !containsFold(postgresEngines, s.Engine) {
		problems = append(problems, fmt.Sprintf("engine is %q, not PostgreSQL", s.Engine))
	}
	if s.Host != "" && validHost(s.Host) != nil {
		problems = append(problems, `"host" must be a host name or IP address`)
	}
	if len(problems) > 0 {
		return rdsSecret{}, fmt.Errorf("the secret value is not a usable RDS PostgreSQL secret: %s", strings.Join(problems, "; "))
	}
	return s, nil
}

func containsFold(list []string, s string) bool {
	return slices.ContainsFunc(list, func(x string) bool { return strings.EqualFold(x, s) })
}

// secretSource fetches the database secret, caches it, and fetches it again
// after the database rejects it.
//
// RDS rotation changes the password in the database and then in the secret;
// open connections stay authenticated, but the next new one fails with
// 28P01 (or 28000 when the alternating-users strategy switched users). That
// failure marks the cached secret stale and the next connection attempt
// fetches it once; concurrent failures with the same password cause one
// fetch, not one each. Nothing is fetched on a timer: the secret is read at
// cold start and when it has been proven wrong, and no oftener.
type secretSource struct {
	arn string
	// name names the secret's setting in errors.
	name    string
	client  SecretsManagerAPI
	timeout time.Duration
	logger  *slog.Logger

	mu      sync.Mutex
	current *rdsSecret
	// stale is set when the database rejected current's password.
	stale bool
	// rejectedVersion is the version that was rejected, for the log line
	// that says whether the refetch found a newer one.
	rejectedVersion string
	// seen holds every password fetched, so that errors can be scrubbed of
	// an old one as well as the current one.
	seen []string
}

// fetch reads the secret from Secrets Manager.
func (s *secretSource) fetch(ctx context.Context) (*rdsSecret, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	out, err := s.client.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(s.arn)})
	if err != nil {
		hint := ""
		if errors.Is(err, context.DeadlineExceeded) {
			hint = fmt.Sprintf(" (no answer within %s: can the function reach Secrets Manager — a VPC endpoint or a NAT gateway?)", s.timeout)
		}
		return nil, fmt.Errorf("dbpool: fetch the database secret %s (%s)%s: %w", s.arn, s.name, hint, err)
	}
	if out.SecretString == nil {
		return nil, fmt.Errorf("dbpool: the database secret %s (%s) has no SecretString: a binary secret is not the RDS secret format", s.arn, s.name)
	}
	secret, err := parseRDSSecret(*out.SecretString)
	if err != nil {
		return nil, fmt.Errorf("dbpool: the database secret %s (%s): %w", s.arn, s.name, err)
	}
	secret.VersionID = aws.ToString(out.VersionId)
	if !slices.Contains(s.seen, secret.Password) {
		s.seen = append(s.seen, secret.Password)
	}
	return &secret, nil
}

// credentials returns the cached secret, fetching it first when there is
// none or the database has rejected it. The lock is held across the fetch so
// that connections opening together wait for one fetch.
func (s *secretSource) credentials(ctx context.Context) (*rdsSecret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != nil && !s.stale {
		return s.current, nil
	}
	secret, err := s.fetch(ctx)
	if err != nil {
		return nil, err // still stale: the next attempt fetches again
	}
	if s.stale {
		if secret.VersionID == s.rejectedVersion {
			s.logger.Warn("dbpool: fetched the database secret again after the database rejected it, but it has not changed: the password in Secrets Manager does not match the database (a rotation still in progress, or a failed one?)",
				"secret_arn", s.arn, "version_id", secret.VersionID, "user", secret.Username)
		} else {
			s.logger.Info("dbpool: fetched the database secret again after the database rejected it; using the new version",
				"secret_arn", s.arn, "rejected_version_id", s.rejectedVersion, "version_id", secret.VersionID, "user", secret.Username)
		}
	}
	s.current, s.stale = secret, false
	return secret, nil
}

// rejected records that the database refused a connection made with
// password. Only a rejection of the current secret marks it stale: a
// connection that started before a refetch must not throw away the new
// secret.
func (s *secretSource) rejected(password, sqlstate string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil || s.stale || s.current.Password != password {
		return
	}
	s.stale = true
	s.rejectedVersion = s.current.VersionID
	s.logger.Warn("dbpool: the database rejected the credentials from the secret; the next connection fetches the secret again",
		"secret_arn", s.arn, "version_id", s.current.VersionID, "user", s.current.Username, "sqlstate", sqlstate)
}

// passwords returns every password fetched so far, to scrub from errors.
func (s *secretSource) passwords() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}
