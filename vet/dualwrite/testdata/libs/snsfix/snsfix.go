// Package snsfix: database/sql next to the AWS SDK v2 SNS client.
package snsfix

import (
	"context"
	"database/sql"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
)

// PublishAfterCommit: a database/sql transaction, then an SNS publish.
func PublishAfterCommit(ctx context.Context, db *sql.DB, c *sns.Client) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1)", 1); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	_, err = c.Publish(ctx, &sns.PublishInput{Message: aws.String("{}")}) // want `publishes sns.Client.Publish after commit`
	return err
}

// PublishFromOtherPath publishes in a handler that writes nothing.
func PublishFromOtherPath(ctx context.Context, c *sns.Client) error {
	_, err := c.Publish(ctx, &sns.PublishInput{Message: aws.String("{}")})
	return err
}
