package lambdaemu

import (
	"fmt"
	"strings"
)

// resolveFunctionName turns what a caller names a function — a name, a
// partial ARN (<account>:function:<name>) or a full ARN, each optionally
// with :<qualifier> — plus the Qualifier parameter into the registered
// name. Only $LATEST is published here: any other qualifier (a version,
// an alias) names nothing, as on a function that has none.
func resolveFunctionName(raw, qualifierParam string) (string, error) {
	name, qualifier := raw, ""
	switch parts := strings.Split(raw, ":"); {
	case len(parts) >= 7 && parts[0] == "arn":
		// arn:partition:lambda:region:account:function:name[:qualifier]
		if parts[2] != "lambda" || parts[5] != "function" || len(parts) > 8 {
			return "", &NotFoundError{Function: raw}
		}
		if parts[1] != Partition || parts[3] != Region || parts[4] != Account {
			return "", fmt.Errorf("%w (the emulator is %s in %s, account %s)", &NotFoundError{Function: raw}, Partition, Region, Account)
		}
		name = parts[6]
		if len(parts) == 8 {
			qualifier = parts[7]
		}
	case len(parts) >= 3 && parts[1] == "function":
		// account:function:name[:qualifier]
		if parts[0] != Account || len(parts) > 4 {
			return "", &NotFoundError{Function: raw}
		}
		name = parts[2]
		if len(parts) == 4 {
			qualifier = parts[3]
		}
	case len(parts) == 2:
		name, qualifier = parts[0], parts[1]
	case len(parts) > 2:
		return "", &NotFoundError{Function: raw}
	}
	if qualifierParam != "" {
		if qualifier != "" && qualifier != qualifierParam {
			return "", fmt.Errorf("%w (the qualifier %q of the name differs from the Qualifier parameter %q)", &NotFoundError{Function: raw}, qualifier, qualifierParam)
		}
		qualifier = qualifierParam
	}
	if qualifier != "" && qualifier != "$LATEST" {
		return "", &NotFoundError{Function: ARN(name) + ":" + qualifier}
	}
	return name, nil
}
